"""Loading StrategyQA and HotpotQA through `datasets` (local shared files and hub names), sampling, options."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import uqh.domains.qa.qa_base as qa_common
from uqh.domains.registry import get_domain_class
from uqh.domains.qa.hotpotqa import context_paragraphs
from uqh.domains.qa.qa_base import DataSource, load_rows, resolve_data_source
from uqh.domains.qa.strategyqa import fallback_corpus
from uqh.rundir.errors import UserError

SHARED = (Path(__file__).resolve().parents[2] / "shared" / "data").resolve()  # as the domains resolve it
SQA_FILE = SHARED / "strategyqa" / "strategyQA_train.json"
HQA_SAMPLE = SHARED / "hotpotqa" / "hotpotqa_distractor_dev_sample100.jsonl"
HQA_SIMPLE = SHARED / "hotpotqa" / "hotpot_dev_v1_simplified.json"


@pytest.fixture(autouse=True)
def _no_shared_env(monkeypatch):
    monkeypatch.delenv("UQH_SHARED_DATA", raising=False)


def test_shared_files_exist():
    for f in (SQA_FILE, HQA_SAMPLE, HQA_SIMPLE):
        assert f.is_file(), f


def test_strategyqa_loads_full_split_through_datasets(tmp_path):
    d = get_domain_class("strategyqa")({"index_dir": str(tmp_path / "idx")})
    assert d.source.files == (str(SQA_FILE),)  # default: the shared data folder next to the repo
    ids = d.all_task_ids()
    assert len(ids) == 2290
    raw = json.loads(SQA_FILE.read_text())
    assert ids == [r["qid"] for r in raw]  # file order
    assert d.select_task_ids(3, seed=42) == ids[:3]  # StrategyQA: the first n, no sampling
    assert d.select_task_ids(None, seed=42) == ids
    t = d.task(ids[0])
    assert t.question == raw[0]["question"] and t.answer is raw[0]["answer"]
    with pytest.raises(UserError, match="unknown task id"):
        d.task("nope")


def test_hotpotqa_default_is_the_100_question_distractor_sample():
    d = get_domain_class("hotpotqa")({})
    assert d.source.files == (str(HQA_SAMPLE),)
    ids = d.all_task_ids()
    rows = [json.loads(line) for line in HQA_SAMPLE.read_text().splitlines()]
    assert ids == [r["id"] for r in rows]
    paragraphs = context_paragraphs(rows)
    assert len(paragraphs) == len({(p.title, p.text) for p in paragraphs}) > 0
    # the corpus holds every question's gold supporting paragraphs
    titles = {p.title for p in paragraphs}
    for r in rows:
        assert set(r["supporting_facts"]["title"]) <= titles


def test_hotpotqa_simplified_file_ids_and_missing_context(tmp_path):
    d = get_domain_class("hotpotqa")({"data": str(HQA_SIMPLE), "index_dir": str(tmp_path / "i")})
    ids = d.all_task_ids()
    assert len(ids) == 7405 and ids[0] == "dev-00000" and ids[-1] == "dev-07404"
    assert d.task("dev-00000").question == "Were Scott Derrickson and Ed Wood of the same nationality?"
    with pytest.raises(UserError, match="no context paragraphs.*--corpus"):
        d.default_corpus()
    # with a user corpus it works
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"title": "Ed Wood", "text": "Ed Wood was an American filmmaker."}) + "\n")
    d2 = get_domain_class("hotpotqa")({"data": str(HQA_SIMPLE), "corpus": str(corpus), "index_dir": str(tmp_path / "j")})
    assert d2.manifest_info()["corpus"] == f"file:{corpus.resolve()}"


def test_hotpotqa_sampling_is_deterministic_nested_and_seeded():
    d = get_domain_class("hotpotqa")({"data": str(HQA_SIMPLE)})
    a = d.select_task_ids(50, seed=42)
    b = get_domain_class("hotpotqa")({"data": str(HQA_SIMPLE)}).select_task_ids(50, seed=42)
    assert a == b and len(set(a)) == 50
    assert d.select_task_ids(5, seed=42) == a[:5]  # nested in n
    assert d.select_task_ids(50, seed=7) != a
    assert a != d.all_task_ids()[:50]
    # closed form of the documented rule: random.Random(seed).shuffle of the canonical order, then the first n
    import random

    order = list(d.all_task_ids())
    random.Random(42).shuffle(order)
    assert a == order[:50]
    assert d.select_task_ids(10_000, seed=42) == d.all_task_ids()


def test_local_file_and_hub_name_share_one_code_path(monkeypatch, tmp_path):
    """Without local data the loader asks `datasets` for the hub name; the rows then take the same path."""
    import datasets

    monkeypatch.setattr(qa_common, "REPO_ROOT", tmp_path)  # no ../shared/data next to this fake repo
    monkeypatch.setattr(qa_common, "_hub_unreachable", lambda: None)
    calls = []
    rows = json.loads(SQA_FILE.read_text())[:4]

    def fake_load_dataset(path, name=None, split=None, **kw):
        calls.append((path, name, split, kw))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    d = get_domain_class("strategyqa")({})
    assert d.source == DataSource(hub="wics/strategy-qa", config=None, split="test")
    assert d.all_task_ids() == [r["qid"] for r in rows]
    assert calls == [("wics/strategy-qa", None, "test", {})]
    h = get_domain_class("hotpotqa")({})
    assert h.source == DataSource(hub="hotpotqa/hotpot_qa", config="fullwiki", split="validation")
    # --split (passed by the runner as the `split` option) picks the hub split; local files are one split
    assert get_domain_class("hotpotqa")({"split": "train"}).source.split == "train"
    assert get_domain_class("strategyqa")({"split": "test", "data": str(SQA_FILE)}).source.files == (str(SQA_FILE),)
    # the local path calls the same function with the json builder
    calls.clear()
    load_rows(DataSource(files=(str(SQA_FILE),)))
    assert calls == [("json", None, "train", {"data_files": [str(SQA_FILE)]})]


def test_hub_offline_fails_with_one_clear_line(monkeypatch, tmp_path):
    import datasets
    import huggingface_hub.constants as hf

    monkeypatch.setattr(qa_common, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hfcache"))
    d = get_domain_class("strategyqa")({})
    with pytest.raises(UserError) as err:
        d.all_task_ids()
    msg = str(err.value)
    assert "\n" not in msg and "wics/strategy-qa" in msg and "--data PATH" in msg


def test_unreachable_hub_fails_fast(monkeypatch, tmp_path):
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf, "ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    with pytest.raises(UserError, match="unreachable.*--data PATH"):
        load_rows(DataSource(hub="wics/strategy-qa", split="test"))


def test_uqh_shared_data_env_and_data_dir(monkeypatch, tmp_path):
    root = tmp_path / "data"
    (root / "strategyqa").mkdir(parents=True)
    rows = [{"qid": "a", "question": "Q?", "answer": True, "facts": ["F."], "term": "T", "description": "d"}]
    (root / "strategyqa" / "strategyQA_train.json").write_text(json.dumps(rows))
    monkeypatch.setenv("UQH_SHARED_DATA", str(root))
    assert get_domain_class("strategyqa")({}).all_task_ids() == ["a"]
    # --data wins over the env var; a directory is searched for the known file names
    assert get_domain_class("strategyqa")({"data": str(SHARED)}).source.files == (str(SQA_FILE),)
    assert get_domain_class("hotpotqa")({"data": str(SHARED / "hotpotqa")}).source.files == (str(HQA_SAMPLE),)
    monkeypatch.setenv("UQH_SHARED_DATA", str(tmp_path / "missing"))
    with pytest.raises(UserError, match="UQH_SHARED_DATA"):
        get_domain_class("strategyqa")({}).all_task_ids()


def test_bad_data_gives_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        resolve_data_source(str(tmp_path / "nope.json"), subdir="x", preferred=(), hub="h", config=None, split="s")
    empty = tmp_path / "emptydir"
    empty.mkdir()
    with pytest.raises(UserError, match="no .json/.jsonl file"):
        resolve_data_source(str(empty), subdir="x", preferred=(), hub="h", config=None, split="s")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"qid": "a", "question": "Q?", "answer": "yes"}]))
    with pytest.raises(UserError, match="JSON boolean"):
        get_domain_class("strategyqa")({"data": str(bad)}).all_task_ids()
    nocol = tmp_path / "nocol.json"
    nocol.write_text(json.dumps([{"qid": "a", "question": "Q?"}]))
    with pytest.raises(UserError, match="lacks answer"):
        get_domain_class("strategyqa")({"data": str(nocol)}).all_task_ids()
    dup = tmp_path / "dup.jsonl"
    dup.write_text(json.dumps({"id": "x", "question": "q", "answer": "a"}) + "\n" + json.dumps({"id": "x", "question": "r", "answer": "b"}) + "\n")
    with pytest.raises(UserError, match="duplicate question id 'x'"):
        get_domain_class("hotpotqa")({"data": str(dup)}).all_task_ids()
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with pytest.raises(UserError, match="cannot load"):
        get_domain_class("hotpotqa")({"data": str(garbage)}).all_task_ids()


@pytest.mark.parametrize(
    "opts,message",
    [
        ({"retrieval": "faiss"}, "--retrieval must be"),
        ({"top_k": 0}, "--top-k must be a positive integer"),
        ({"top_k": "three"}, "--top-k must be a positive integer"),
        ({"retrieval": "es"}, "needs --es-url URL and --es-index NAME"),
        ({"retrieval": "es", "es_url": "http://u:secret@localhost:9200", "es_index": "x"}, "do not put credentials"),
        ({"colour": "blue"}, "unknown strategyqa option"),
    ],
)
def test_option_errors(opts, message):
    with pytest.raises(UserError, match=message):
        get_domain_class("strategyqa")(opts)


def test_top_k_string_from_cli_is_accepted():
    assert get_domain_class("hotpotqa")({"top_k": "2"}).top_k == 2
    assert get_domain_class("hotpotqa")({}).top_k == 5
    assert get_domain_class("strategyqa")({}).top_k == 3


def test_strategyqa_fallback_corpus_is_labelled_and_warned(tmp_path, caplog):
    d = get_domain_class("strategyqa")({"index_dir": str(tmp_path / "idx")})
    qa_common._warned.discard("strategyqa-fallback")
    with caplog.at_level(logging.WARNING):
        info = d.manifest_info()
        d.default_corpus()
    assert info["corpus"] == "fallback-facts"
    assert sum("fallback corpus" in r.message for r in caplog.records) == 1  # once
    rows = json.loads(SQA_FILE.read_text())
    paragraphs = fallback_corpus(list(d.tasks.values()))
    assert info["n_passages"] == len(paragraphs)
    assert paragraphs[0].title == rows[0]["term"]
    assert paragraphs[0].text == f"{rows[0]['term']}: {rows[0]['description']}."
    texts = {p.text for p in paragraphs}
    assert "Julius Caesar had three children." in texts
    assert info["data_files"] == [str(SQA_FILE)] and len(info["data_sha256"]) == 64
    assert info["top_k"] == 3 and info["retrieval"] == "bm25"


def test_a_data_file_that_is_not_json_gives_one_line_through_the_cli(tmp_path, capsys):
    # the datasets library logs its own errors; uqh's one line is the only thing the user sees
    from uqh.cli import main

    notes = tmp_path / "notes.md"
    notes.write_text("# not a data set\n\nsome prose\n")
    out = tmp_path / "run"
    assert main(["run", "--domain", "hotpotqa", "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1",
                 "--tasks", "2", "--data", str(notes), "--out", str(out), "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"uqh run: error: cannot load {notes}: ")
    assert "--data must be a JSON or JSONL file" in captured.err and "pass --data" not in captured.err
    assert not out.exists()
