"""A table-driven sweep of bad inputs across every command: each gets one line on stderr naming the problem,
exit 2, nothing on stdout and nothing written -- no traceback, no usage dump, no file (issue 33).

Every case runs in-process and fails at argument or config validation, before any model call, so the sweep takes
seconds. ``{run}`` is a finished run directory (a copy of ``tests/data/pre_rundir_run``), ``{bin}`` a binary file,
``{empty}`` an empty file, ``{missing}`` a path that does not exist. Where writing *is* the documented behaviour of
a bad input, the case would say so here; none of these writes.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from uqh.cli import main

PRE_RUN = Path(__file__).resolve().parent / "data" / "pre_rundir_run"
URL = "http://127.0.0.1:9/v1"
RUN = ["run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base", URL, "--out", "o"]
JUDGE = ["judge", "{run}", "--judge-model", "openai/j", "--api-base", URL, "--out", "j"]
CONT = ["continue", "{run}", "--out", "c"]


def _cases() -> list[tuple[list[str], str]]:
    cases: list[tuple[list[str], str]] = []
    add = lambda fragment, *argv: cases.append((list(argv), fragment))  # noqa: E731
    # ---- argparse: one line plus "see --help", never a usage dump
    add("invalid choice", "nope")
    for cmd, required in (("score", []), ("certify", []), ("audit", []), ("report", ["--out", "r"]),
                          ("export", ["--to", "e"]), ("repair", [])):
        add("see uqh " + cmd + " --help", cmd)  # missing RUN_DIR
        add("unrecognized arguments", cmd, "{run}", *required, "--no-such-flag")
    for flag in ("--tasks", "--samples", "--step-budget", "--seed", "--max-tokens", "--top-logprobs",
                 "--concurrency", "--workers", "--max-retries", "--observation-chars", "--breaker-failures"):
        add("invalid int value", *RUN, flag, "x")
    for flag in ("--temperature", "--top-p", "--timeout", "--breaker-window", "--stop-on-consensus"):
        for value in ("x", "nan", "inf"):
            add("", *RUN, flag, value)
    add("invalid choice", *RUN, "--backend", "nope")
    add("invalid choice", *RUN, "--retrieval", "nope")
    add("invalid choice", *RUN, "--stop-rule", "nope")
    add("invalid choice", "score", "{run}", "--censoring", "nope")
    add("invalid choice", "export", "{run}", "--format", "nope")
    add("invalid choice", "judge", "{run}", "--out", "j", "--report", "--format", "nope")
    add("invalid choice", "index", "--backend", "nope", "--out", "i")
    add("expected one argument", *RUN, "--out")
    add("not allowed with argument", *RUN, "--task-ids", "a")
    # ---- run: values out of range
    for flag, value in (("--tasks", "0"), ("--tasks", "-3"), ("--samples", "0"), ("--step-budget", "0"),
                        ("--concurrency", "0"), ("--workers", "0"), ("--max-retries", "-1"), ("--timeout", "0"),
                        ("--timeout", "-5"), ("--breaker-failures", "0"), ("--breaker-window", "-1"),
                        ("--temperature", "-0.5"), ("--top-p", "1.5"), ("--top-p", "-1"), ("--max-tokens", "0"),
                        ("--top-logprobs", "-1"), ("--top-logprobs", "50"), ("--seed", "-1"),
                        ("--seed", str(2**63)), ("--observation-chars", "-1"), ("--stop-on-consensus", "0"),
                        ("--stop-on-consensus", "1.5")):
        add(flag, *RUN, flag, value)
    # ---- run: domains, presets, data, options
    add("unknown domain 'nope'", "run", "--domain", "nope", "--tasks", "1", "--model", "openai/x", "--api-base", URL,
        "--out", "o")
    add("nope", "run", "--preset", "nope", "--out", "o")
    for domain in ("arithmetic", "strategyqa", "hotpotqa"):
        add("split", "run", "--domain", domain, "--split", "nope", "--tasks", "1", "--model", "openai/x",
            "--api-base", URL, "--out", "o")
    add("{missing}", "run", "--domain", "hotpotqa", "--data", "{missing}", "--tasks", "1", "--model", "openai/x",
        "--api-base", URL, "--out", "o")
    add("", "run", "--domain", "strategyqa", "--data", "{bin}", "--tasks", "1", "--model", "openai/x",
        "--api-base", URL, "--out", "o")
    add("corpus file", "run", "--domain", "hotpotqa", "--corpus", "{bin}", "--tasks", "1", "--model", "openai/x",
        "--api-base", URL, "--out", "o")
    add("corpus file", "run", "--domain", "hotpotqa", "--corpus", "{empty}", "--tasks", "1", "--model", "openai/x",
        "--api-base", URL, "--out", "o")
    add("--corpus", "run", "--domain", "hotpotqa", "--corpus", "{missing}", "--tasks", "1", "--model",
        "openai/x", "--api-base", URL, "--out", "o")
    add("-D", *RUN, "-D", "novalue")
    add("", *RUN, "-D", "no_such_option=1")
    add("", "run", "--domain", "arithmetic", "--task-ids", "nope-1", "--model", "openai/x", "--api-base", URL,
        "--out", "o")
    add("--ray-address needs --backend ray", *RUN, "--ray-address", "auto")
    add("--stop-on-consensus needs --samples", *RUN, "--stop-on-consensus", "0.1")
    add("--user-api-base", *RUN, "--user-api-base", URL)
    # ---- run: endpoints
    for url in ("ftp://h/v1", "http://", "not a url", "http://h:notaport/v1", "http://u:p@h/v1",
                "http://h/v1?api_key=k", "http://h/v1#frag", "//h/v1"):
        add("--api-base", "run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base", url,
            "--out", "o")
    for url in ("http://h/v1;api_key=k", "http://u:pa/ss@h/v1", "u:pa/ss@h"):  # ; parameters, malformed userinfo
        add("--api-base", "run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base", url,
            "--out", "o")
    for way in (["--es-url"], ["-D", "es_url="]):
        for url in ("http://h:9200/?api_key=k", "http://h:9200/;k=v", "http://h:9200/#k", "u:p@h:9200"):
            add("--es-url", "run", "--domain", "hotpotqa", "--tasks", "1", "--model", "openai/x", "--api-base", URL,
                "--out", "o", *(way[:-1] + [way[-1] + url] if way[0] == "-D" else way + [url]))
    add("--user-model needs a domain with a simulated user", *RUN, "--user-model", "openai/u")
    add("given twice", *RUN, "--api-base", URL)
    add("--endpoints", "run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--endpoints",
        "{bin}", "--out", "o")
    add("--endpoints", "run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--endpoints",
        "{missing}", "--out", "o")
    add("lists no endpoint", "run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--endpoints",
        "{empty}", "--out", "o")
    add("", "run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--out", "o")  # no endpoint
    # ---- run: the output directory
    add("", "run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base", URL, "--out",
        "{empty}")
    add("different config", "run", "--domain", "arithmetic", "--tasks", "8", "--step-budget", "4", "--model",
        "openai/fake", "--api-base", URL, "--out", "{run}")
    # ---- continue
    add("not a run directory", "continue", "{missing}", "--out", "c")
    add("", "continue", "{run}")  # no --out
    for flag, value in (("--branches", "0"), ("--branches", "-1"), ("--extra-steps", "-1"), ("--min-valid", "-1"),
                        ("--concurrency", "0"), ("--workers", "0"), ("--timeout", "0"), ("--max-retries", "-1"),
                        ("--bootstrap", "-1")):
        add(flag, *CONT, flag, value)
    for flag in ("--branches", "--extra-steps", "--min-valid", "--concurrency", "--bootstrap"):
        add("invalid int value", *CONT, flag, "x")
    add("--api-base", *CONT, "--api-base", "http://u:p@h/v1")
    add("--api-base", *CONT, "--api-base", "http://h/v1?key=k")
    add("--endpoints", *CONT, "--endpoints", "{bin}")
    add("", *CONT, "--out", "{run}")
    add("", *CONT, "--ids", "nope")
    add("", *CONT, "--stop-rule", "nope")
    add("", *CONT, "--weights", "nope")
    add("", *CONT, "--score", "nope")
    # ---- score
    add("not a run directory", "score", "{missing}")
    add("not a run directory", "score", "{empty}")
    add("", "score", "{run}", "--predictor", "nope")
    add("", "score", "{run}", "--score", "nope")
    add("", "score", "{run}", "--weights", "nope")
    add("", "score", "{run}", "--labels", "nope")
    add("", "score", "{run}", "--bootstrap", "-1")
    add("invalid int value", "score", "{run}", "--bootstrap", "x")
    add("--q-z", "score", "{run}", "--q-z", "{bin}")
    add("q_Z file", "score", "{run}", "--censoring", "exact", "--q-z", "{bin}")
    add("q_Z file", "score", "{run}", "--censoring", "exact", "--q-z", "{missing}")
    add("is a directory, not a file", "score", "{run}", "--censoring", "exact", "--q-z", "{run}")  # said "does not exist"
    add("is a directory, not a file", "report", "{run}", "--out", "r", "--q-z", "{run}")
    add("", "score", "{run}", "--censoring", "exact", "--q-z", "{afile}")
    add("", "score", "{run}", "--paired")
    add("", "score", "{run}", "--fixed-rank", "nope")
    add("", "score", "{run}", "--calibration", "nope")
    # ---- certify
    add("not a run directory", "certify", "{missing}", "--alpha", "0.1")
    for value in ("0", "1", "-0.1", "2"):
        add("--alpha", "certify", "{run}", "--alpha", value)
    add("", "certify", "{run}", "--alpha", "x")
    for value in ("0", "-0.5", "1.5"):
        add("--cal-frac", "certify", "{run}", "--alpha", "0.1", "--cal-frac", value)
    add("--cal-ids", "certify", "{run}", "--alpha", "0.1", "--cal-ids", "{bin}")
    add("--cal-ids", "certify", "{run}", "--alpha", "0.1", "--cal-ids", "{missing}")
    add("--cal-ids", "certify", "{run}", "--alpha", "0.1", "--cal-ids", "{empty}")
    add("--cal-ids", "certify", "{run}", "--alpha", "0.1", "--cal-ids", "{afile}")
    add("--verified", "certify", "{run}", "--alpha", "0.1", "--verified", "{bin}")
    add("--verified", "certify", "{run}", "--alpha", "0.1", "--verified", "{missing}")
    add("--verified", "certify", "{run}", "--alpha", "0.1", "--verified", "{afile}")
    add("", "certify", "{run}", "--alpha", "0.1", "--resplits", "-1")
    add("", "certify", "{run}", "--alpha", "0.1", "--stop-delta", "2")
    # ---- audit, report, export, repair, schema
    add("not a run directory", "audit", "{missing}")
    add("", "audit", "{run}", "--bootstrap", "-1")
    add("not a run directory", "report", "{missing}", "--out", "r")
    add("q_Z file", "report", "{run}", "--out", "r", "--q-z", "{bin}")
    add("q_Z file", "report", "{run}", "--out", "r", "--q-z", "{missing}")
    add("", "report", "{run}", "--out", "r", "--max-traces", "-1")
    add("", "report", "{run}", "--out", "{empty}")
    add("", "report", "{run}", "--out", "r", "--bootstrap", "-1")
    add("is inside the run directory", "report", "{run}", "--out", "{run}/rep")
    add("is inside the run directory", *RUN[:-1], "{run}/sub")  # a run inside another run
    add("is inside the run directory", "import", "tau2", "{afile}", "--out", "{run}/imp")
    add("is a non-empty directory that holds no earlier output", "report", "{run}", "--out", "{nonempty}")
    add("is not a UTF-8 text file", "report", "{run}", "--out", "r", "--certify", "{bin}")
    add("is inside the run directory", "audit", "{run}", "--out", "{run}/aud")
    add("is inside the run directory", "export", "{run}", "--to", "{run}/exp")
    add("is a non-empty directory that holds no earlier output", "export", "{run}", "--to", "{nonempty}")
    add("is inside the run directory", "certify", "{run}", "--alpha", "0.1", "--export-verification", "{run}/v.csv")
    add("is inside the run directory", "judge", "--report", "--out", "{run}", "--tables", "{run}/t")
    add("is inside the run directory", "index", "--corpus", "{run}/manifest.json", "--out", "{run}/idx")
    add("unknown preset 'nope'", "regenerate", "nope", "--out", "o")
    add("--set expects PRESET:KEY=VALUE", "regenerate", "--quick", "--set", "paper-webshop", "--out", "o")
    add("Extra inputs are not permitted", "regenerate", "--quick", "--set", "all:nope=1", "--out", "o")
    add("--sample: Input should be greater than or equal to 1", "regenerate", "--quick", "--sample", "0", "--out", "o")
    add("argument --bootstrap: must be >= 1, got 0", "regenerate", "--quick", "--bootstrap", "0", "--out", "o")
    add("exists and is not a directory", "regenerate", "--quick", "--report", "{empty}", "--dry-run")
    add("not a run directory", "export", "{missing}", "--to", "e")
    add("", "export", "{run}", "--to", "e", "--bootstrap", "-1")
    add("", "export", "{run}", "--to", "{empty}")
    add("not a run directory", "repair", "{missing}")
    add("not a run directory", "repair", "{empty}")
    add("unrecognized arguments", "schema", "extra")
    # ---- judge
    add("", *JUDGE, "--metrics", "nope")
    add("", *JUDGE, "--repeats", "0")
    add("", *JUDGE, "--limit", "0")
    add("", *JUDGE, "--concurrency", "0")
    add("", *JUDGE, "--max-tokens", "0")
    add("", *JUDGE, "--temperature", "-1")
    add("", *JUDGE, "--temperature", "nan")
    add("--api-base", "judge", "{run}", "--judge-model", "openai/j", "--api-base", "http://u:p@h/v1", "--out", "j")
    add("--api-base", "judge", "{run}", "--judge-model", "openai/j", "--api-base", "http://h/v1?k=v", "--out", "j")
    add("--api-base", "judge", "{run}", "--judge-model", "openai/j", "--api-base", "ftp://h", "--out", "j")
    add("not a run directory", "judge", "{missing}", "--judge-model", "openai/j", "--api-base", URL, "--out", "j")
    add("", "judge", "--judge-model", "openai/j", "--api-base", URL, "--out", "j")  # no run
    add("", "judge", "{run}", "--out", "j")  # no judge model
    add("", "judge", "{run}", "--out", "{empty}", "--judge-model", "openai/j", "--api-base", URL)
    add("", "judge", "{run}", "--out", "{run}", "--judge-model", "openai/j", "--api-base", URL)
    add("", "judge", "--report", "--out", "{missing}")
    add("", "judge", "--report", "--out", "{run}", "--labels", "{bin}")
    # ---- probe
    PROBE = ["probe", "{run}", "--probe", "p_true", "--model", "openai/p", "--api-base", URL]
    add("invalid choice", *PROBE[:2], "--probe", "nope", "--model", "openai/p", "--out", "p")
    add("", "probe", "--probe", "p_true", "--model", "openai/p", "--out", "p")  # no run
    add("not a run directory", "probe", "{missing}", "--probe", "p_true", "--model", "openai/p", "--api-base", URL,
        "--out", "p")
    add("--api-base", *PROBE[:6], "--api-base", "http://u:p@h/v1", "--out", "p")
    add("--api-base", *PROBE[:6], "--api-base", "http://h/v1?k=v", "--out", "p")
    add("", *PROBE, "--out", "{run}")  # never inside (or onto) a run
    add("", *PROBE, "--out", "{empty}")  # a file
    add("invalid int value", *PROBE, "--out", "p", "--concurrency", "x")
    # ---- one range per flag, the same in every command (issues 40, 42): a seed is 0 .. 2**31-1 everywhere, a
    # negative bootstrap seed never reaches numpy, --top-logprobs is run's 0 .. 20
    seed_range = "must be between 0 and 2147483647 (a 32-bit seed, as providers take)"
    for argv in (["score", "{run}"], ["certify", "{run}"], ["report", "{run}", "--out", "r"],
                 ["export", "{run}", "--to", "e"], ["continue", "{run}", "--out", "c", "--sample", "2"],
                 ["judge", "{run}", "--judge-model", "openai/j", "--api-base", URL, "--out", "j"], [*PROBE, "--out", "p"],
                 RUN):
        for value in ("-5", "99999999999999"):
            add(f"argument --seed: {seed_range}, got {value}", *argv, "--seed", value)
    add(f"argument --bootstrap-seed: {seed_range}, got -1", "judge", "--report", "--out", "j", "--bootstrap-seed", "-1")
    for argv in (RUN, [*PROBE, "--out", "p"]):
        add("argument --top-logprobs: must be between 0 and 20 (the most providers return), got 500", *argv,
            "--top-logprobs", "500")
    for argv in (RUN, [*CONT, "--qz-only"], ["judge", "{run}", "--judge-model", "openai/j", "--api-base", URL, "--out",
                                            "j"], [*PROBE, "--out", "p"]):
        add("argument --concurrency: must be >= 1, got 0", *argv, "--concurrency", "0")
        add("argument --timeout: must be > 0 seconds, got 0", *argv, "--timeout", "0")
    for argv in (["score", "{run}"], ["certify", "{run}"], ["export", "{run}", "--to", "e"],
                 ["judge", "--report", "--out", "j"]):
        add("argument --bootstrap: must be >= 0, got -1", *argv, "--bootstrap", "-1")
    for argv in (["audit", "{run}"], ["report", "{run}", "--out", "r"], [*CONT, "--qz-only"]):
        add("argument --bootstrap: must be >= 1, got 0", *argv, "--bootstrap", "0")
    # a preset's dry run checks every flag too (it used to return before the breaker flags)
    add("argument --breaker-failures: must be >= 1, got 0", "run", "--preset", "paper-hotpotqa", "--dry-run",
        "--breaker-failures", "0")
    add("argument --breaker-window: must be >= 0 seconds, got -1", "run", "--preset", "paper-hotpotqa", "--dry-run",
        "--breaker-window", "-1")
    # ---- view
    add("", "view", "{missing}")
    add("", "view", "{empty}")
    add("", "view", "{run}", "--port", "99999")
    add("invalid int value", "view", "{run}", "--port", "x")
    # ---- index
    add("corpus file", "index", "--corpus", "{bin}", "--out", "i")
    add("corpus file", "index", "--corpus", "{missing}", "--out", "i")
    add("corpus file", "index", "--corpus", "{empty}", "--out", "i")
    add("", "index", "--out", "i")  # nothing to index
    add("", "index", "--backend", "es", "--corpus", "{empty}")
    add("", "index", "--domain", "nope", "--out", "i")
    # ---- import
    add("does not exist", "import", "tau2", "{missing}", "--out", "o")
    add("not a UTF-8 text file", "import", "tau2", "{bin}", "--out", "o")
    add("is not JSON", "import", "tau2", "{empty}", "--out", "o")
    add("is not JSON", "import", "tau2", "{afile}", "--out", "o")
    add("is a directory", "import", "tau2", "{run}", "--out", "o")
    add("invalid choice", "import", "nope", "{afile}", "--out", "o")
    add("see uqh import --help", "import", "tau2", "{afile}")  # no --out
    add("is not empty", "import", "tau2", "{afile}", "--out", "{run}")
    add("is not a directory", "import", "tau2", "{afile}", "--out", "{empty}")
    # ---- setup, doctor
    add("invalid choice", "setup", "nope")
    add("see uqh setup --help", "setup")  # nothing to set up named
    add("--jobs must be >= 1", "setup", "local", "--jobs", "0")
    add("invalid int value", "setup", "local", "--jobs", "x")
    add("unrecognized arguments", "doctor", "extra")
    add("unrecognized arguments", "doctor", "--speed")
    # ---- list
    add("invalid choice", "list", "widgets")
    add("invalid choice", "list", "--format", "yaml")
    return cases


CASES = _cases()


def _substitute(text: str, subst: dict[str, str]) -> str:
    for key, value in subst.items():
        text = text.replace(key, value)
    return text


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_sweep_covers_at_least_150_bad_inputs_across_every_command():
    assert len(CASES) >= 150
    from uqh.cli import COMMANDS

    assert {argv[0] for argv, _ in CASES} >= set(COMMANDS)


@pytest.mark.parametrize("argv,fragment", CASES, ids=[f"{i:03d}-{' '.join(a)[:60]}" for i, (a, _) in enumerate(CASES)])
def test_a_bad_input_is_one_line_exit_2_and_nothing_written(argv, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(PRE_RUN, tmp_path / "run")
    (tmp_path / "bin.dat").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "afile").write_text("not what was expected\n")
    (tmp_path / "nonempty").mkdir()
    (tmp_path / "nonempty" / "notes.txt").write_text("someone's notes\n")
    subst = {"{nonempty}": str(tmp_path / "nonempty"), "{run}": str(tmp_path / "run"), "{bin}": str(tmp_path / "bin.dat"), "{empty}": str(tmp_path / "empty.txt"),
             "{missing}": str(tmp_path / "missing"), "{afile}": str(tmp_path / "afile")}
    argv = [_substitute(a, subst) for a in argv]
    before = _digest(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse exits
        code = exc.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in err, err
    for key, value in subst.items():
        fragment = fragment.replace(key, value)
    assert fragment in lines[0]
    assert out == ""
    assert _digest(tmp_path) == before  # nothing written, nothing touched


# ------------------------------------------------------------------------------------- values read from a run (issue 42)


def _edited_run(path: Path, value: str | None, *, field: str = "verbal_confidence") -> Path:
    """12 complete arithmetic episodes; with ``value``, the first step of episode t3 holds ``field`` = that raw
    JSON text (an edited or foreign line), else null (what the reader must make of an out-of-range value)."""
    import json

    from scoring_fixtures import make_episode, write_run_dir

    eps = [make_episode(f"t{i}#0", "clean", [0.2 + 0.05 * i, 0.5], outcome=i % 2) for i in range(12)]
    run = write_run_dir(path, eps)
    lines = (run / "episodes.jsonl").read_text().splitlines()
    ep = json.loads(lines[3])
    target = ep["steps"][0] if field == "verbal_confidence" else ep
    target[field] = None
    text = json.dumps(ep)
    if value is not None:
        text = text.replace(f'"{field}": null', f'"{field}": {value}', 1)
    lines[3] = text
    (run / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    return run


@pytest.mark.parametrize("field,value", [("verbal_confidence", "7.5"), ("verbal_confidence", "NaN"),
                                         ("verbal_confidence", "-0.2"), ("outcome", "7"), ("reward", "Infinity")])
def test_an_out_of_range_value_is_read_as_missing_with_a_note(field, value, tmp_path, capsys):
    """A verbal_confidence of 7.5 or NaN changed the scores without a note (AUROC 0.500 -> 0.545, or n 12 -> 11):
    now every reader sees it as missing -- the scores equal those of the line with null -- and score and audit
    say so."""
    edited = _edited_run(tmp_path / "edited", value, field=field)
    null = _edited_run(tmp_path / "null", None, field=field)
    outputs = {}
    for run in (edited, null):
        assert main(["score", str(run), "--bootstrap", "0", "--format", "json"]) == 0
        out, err = capsys.readouterr()
        outputs[run.name] = (json.loads(out), err)
    scores = {name: json.dumps(o, sort_keys=True).replace(str(tmp_path / name), "R") for name, (o, _) in outputs.items()}
    assert '"rows"' in scores["edited"] and scores["edited"] == scores["null"]
    note = f"{edited}: 1 recorded value(s) outside their range read as missing ({field} 1x"
    assert note in outputs["edited"][1] and "outside their range" not in outputs["null"][1]
    assert main(["audit", str(edited), "--bootstrap", "1"]) == 0
    assert note in capsys.readouterr().err


# ------------------------------------------------------------------------------------- empty runs, runs being written

EMPTY_RUN_COMMANDS = [
    ["score", "{run}"], ["certify", "{run}"], ["report", "{run}", "--out", "r"], ["audit", "{run}"],
    ["export", "{run}", "--to", "e"], ["judge", "{run}", "--judge-model", "openai/j", "--api-base", URL, "--out", "j"],
    ["probe", "{run}", "--probe", "p_true", "--model", "openai/p", "--api-base", URL, "--out", "p"],
]


@pytest.mark.parametrize("argv", EMPTY_RUN_COMMANDS, ids=[a[0] for a in EMPTY_RUN_COMMANDS])
def test_an_empty_run_is_refused_alike_by_every_reading_command(argv, tmp_path, capsys, monkeypatch):
    """On a run with a manifest and no finished episode, score, report and certify exited 2 while audit, export,
    judge and probe exited 0: now all exit 2 with the same line, and write nothing."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    shutil.copy(PRE_RUN / "manifest.json", tmp_path / "run" / "manifest.json")
    before = _digest(tmp_path)
    assert main([a.replace("{run}", str(tmp_path / "run")) for a in argv]) == 2
    out, err = capsys.readouterr()
    (line,) = err.strip().splitlines()
    assert f"uqh {argv[0]}: error: {tmp_path / 'run'} has no finished episode" in line and "run `uqh run` first" in line
    assert out == "" and _digest(tmp_path) == before


def test_certify_on_a_run_being_written_says_so(tmp_path, capsys):
    import os
    import subprocess
    import sys

    run = tmp_path / "run"
    shutil.copytree(PRE_RUN, run)
    repo = Path(__file__).resolve().parent.parent
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from uqh.harness.store import lock\n"
                               f"with lock.hold({str(run)!r}):\n    print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(repo)))
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["certify", str(run), "--alpha", "0.3", "--cal-frac", "1.0"]) == 0
    finally:
        holder.communicate("", timeout=60)
    err = capsys.readouterr().err
    assert f"uqh certify: note: {run}: 8 of 8 planned episodes, run in progress (pid {holder.pid}" in err, err


@pytest.mark.parametrize("value", ["3.0", "NaN"])
def test_a_token_logprob_out_of_range_makes_its_calls_tokens_missing_with_a_note(value, tmp_path, capsys):
    """A token logprob above 0 (a probability above 1) or NaN in a sidecar row: that call's tokens are read as
    missing (as a provider without logprobs) -- the scores equal those of the row with null tokens -- and score
    says so."""
    rows = {}
    for name, tokens in (("edited", value), ("null", None)):
        run = tmp_path / name
        shutil.copytree(PRE_RUN, run)
        lines = (run / "logprobs.jsonl").read_text().splitlines()
        row = json.loads(lines[2])
        assert row["tokens"]
        if tokens is None:
            row["tokens"] = None
            lines[2] = json.dumps(row)
        else:
            text = json.dumps(row)
            first = json.dumps(row["tokens"][0]["logprob"])
            lines[2] = text.replace(f'"logprob": {first}', f'"logprob": {tokens}', 1)
        (run / "logprobs.jsonl").write_text("\n".join(lines) + "\n")
        assert main(["score", str(run), "--bootstrap", "0", "--format", "json"]) == 0
        out, err = capsys.readouterr()
        rows[name] = (json.dumps(json.loads(out), sort_keys=True).replace(str(run), "R"), err)
    assert rows["edited"][0] == rows["null"][0]
    assert f"{tmp_path / 'edited'}: 1 token logprob(s) out of range" in rows["edited"][1]
    assert "out of range" not in rows["null"][1]
