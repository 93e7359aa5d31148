"""Loading StrategyQA and HotpotQA through `datasets` (the packaged demo data, local files and hub names),
sampling, options."""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

import uqh.domains.qa.qa_base as qa_common
from uqh.domains.domain_registry import get_domain_class
from uqh.domains.qa.hotpotqa import context_paragraphs
from uqh.domains.data_files import data_sha256, read_data_bytes
from uqh.domains.qa.qa_base import PACKAGED_DATA, DataSource, load_rows, resolve_data_source
from uqh.domains.qa.strategyqa import fallback_corpus
from uqh.rundir.errors import UserError

SQA_FILE = PACKAGED_DATA / "strategyqa" / "strategyQA_train.json.gz"
HQA_SAMPLE = PACKAGED_DATA / "hotpotqa" / "hotpotqa_distractor_dev_sample100.jsonl.gz"
HQA_SIMPLE = Path(__file__).resolve().parent / "data" / "hotpotqa" / "hotpot_dev_v1_simplified.json.gz"


def _json(path: Path):
    return json.loads(read_data_bytes(path))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in read_data_bytes(path).decode().splitlines()]


def test_packaged_files_are_the_originals_their_sources_name():
    """Each packaged file decompresses to the original whose sha256 SOURCES.md gives (and lists no other file)."""
    table = (PACKAGED_DATA / "SOURCES.md").read_text()
    listed = dict(re.findall(r"^\| `([^`]+\.gz)` .*`([0-9a-f]{64})` \|$", table, re.M))
    packaged = {p.relative_to(PACKAGED_DATA).as_posix() for p in PACKAGED_DATA.rglob("*.gz")}
    assert set(listed) == packaged == {"strategyqa/strategyQA_train.json.gz",
                                       "hotpotqa/hotpotqa_distractor_dev_sample100.jsonl.gz"}
    for name, sha in listed.items():
        assert data_sha256(PACKAGED_DATA / name) == sha, name
    assert data_sha256(HQA_SIMPLE) == "05001dcdeb2b2b2243a88f23daaf8de9237494cd387e13bc25854d3e031101d3"


def test_strategyqa_loads_full_split_through_datasets(tmp_path):
    d = get_domain_class("strategyqa")({"index_dir": str(tmp_path / "idx")})
    assert d.source.files == (str(SQA_FILE),) and d.source.origin == "packaged"  # default: the packaged data
    ids = d.all_task_ids()
    assert len(ids) == 2290
    raw = _json(SQA_FILE)
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
    rows = _jsonl(HQA_SAMPLE)
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

    monkeypatch.setattr(qa_common, "_hub_unreachable", lambda: None)
    calls = []
    rows = _json(SQA_FILE)[:4]

    def fake_load_dataset(path, name=None, split=None, **kw):
        calls.append((path, name, split, kw))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    d = get_domain_class("strategyqa")({"source": "hub"})
    assert d.source == DataSource(hub="wics/strategy-qa", config=None, split="test", origin="hub")
    assert d.all_task_ids() == [r["qid"] for r in rows]
    assert calls == [("wics/strategy-qa", None, "test", {})]
    assert d.source.describe() == {"data_source": "hub", "data_hub": "wics/strategy-qa", "data_config": None,
                                   "data_split": "test"}
    h = get_domain_class("hotpotqa")({"source": "hub"})
    assert h.source == DataSource(hub="hotpotqa/hotpot_qa", config="fullwiki", split="validation", origin="hub")
    # --split (passed by the runner as the `split` option) picks the hub split; local files are one split
    assert get_domain_class("hotpotqa")({"split": "train", "source": "hub"}).source.split == "train"
    assert get_domain_class("strategyqa")({"split": "test", "data": str(SQA_FILE)}).source.files == (str(SQA_FILE),)
    # the local path calls the same function with the json builder
    calls.clear()
    load_rows(DataSource(files=(str(SQA_FILE),)))
    assert calls == [("json", None, "train", {"data_files": [str(SQA_FILE)]})]


def test_hub_offline_fails_with_one_clear_line(monkeypatch, tmp_path):
    import datasets
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hfcache"))
    d = get_domain_class("strategyqa")({"source": "hub"})
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


def test_data_dir_is_searched_for_known_names_plain_or_gz(monkeypatch, tmp_path):
    root = tmp_path / "data"
    (root / "strategyqa").mkdir(parents=True)
    rows = [{"qid": "a", "question": "Q?", "answer": True, "facts": ["F."], "term": "T", "description": "d"}]
    (root / "strategyqa" / "strategyQA_train.json").write_text(json.dumps(rows))
    d = get_domain_class("strategyqa")({"data": str(root)})
    assert d.all_task_ids() == ["a"] and d.source.origin == "file"
    assert d.source.describe()["data_source"] == "file"
    # a directory is searched (itself, then <dir>/<domain>/) for the known names, .gz copies included
    assert get_domain_class("strategyqa")({"data": str(PACKAGED_DATA)}).source.files == (str(SQA_FILE),)
    assert get_domain_class("hotpotqa")({"data": str(PACKAGED_DATA / "hotpotqa")}).source.files == (str(HQA_SAMPLE),)
    other = tmp_path / "other"
    other.mkdir()
    (other / "mine.jsonl.gz").write_bytes(HQA_SAMPLE.read_bytes())
    assert get_domain_class("hotpotqa")({"data": str(other)}).all_task_ids() == [r["id"] for r in _jsonl(HQA_SAMPLE)]
    with pytest.raises(UserError, match="--data and -D source=hub name two data sources"):
        get_domain_class("strategyqa")({"data": str(root), "source": "hub"}).source  # noqa: B018
    with pytest.raises(UserError, match="source"):
        get_domain_class("strategyqa")({"source": "internet"})


def test_a_broken_install_without_the_packaged_data_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(qa_common, "PACKAGED_DATA", tmp_path / "nothing")
    with pytest.raises(UserError, match="packaged strategyqa data is missing.*reinstall uqh"):
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
    rows = _json(SQA_FILE)
    paragraphs = fallback_corpus(list(d.tasks.values()))
    assert info["n_passages"] == len(paragraphs)
    assert paragraphs[0].title == rows[0]["term"]
    assert paragraphs[0].text == f"{rows[0]['term']}: {rows[0]['description']}."
    texts = {p.text for p in paragraphs}
    assert "Julius Caesar had three children." in texts
    assert info["data_files"] == [str(SQA_FILE)] and info["data_source"] == "packaged"
    assert info["data_sha256"] == data_sha256(SQA_FILE)  # the original file's hash, as SOURCES.md gives it
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
