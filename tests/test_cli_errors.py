"""The `uqh` command line as a user meets it: every --help works without heavy imports, no arguments prints help
(exit 2), and common mistakes give one line on stderr, exit 2, and write nothing -- never a traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: Imported by `uqh ... --help` only if a command module imports them at top level (seconds of start-up).
HEAVY = ("litellm", "openai", "tau2", "bm25s", "numpy", "scipy", "matplotlib", "datasets", "elasticsearch", "pandas",
         "pyarrow", "jinja2", "playwright", "ray")
DRIVER = f"""
import json, sys
from uqh.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
sys.stdout.flush()
print("\\n@@" + json.dumps({{"rc": rc, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def _uqh(argv: list[str], cwd: Path) -> tuple[int, str, str, list[str]]:
    proc = subprocess.run([sys.executable, "-c", DRIVER, *argv], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    out, _, tail = proc.stdout.rpartition("\n@@")
    result = json.loads(tail)
    return result["rc"], out, proc.stderr, result["heavy"]


HELP = [[], ["run"], ["score"], ["continue"], ["audit"], ["report"], ["index"], ["repair"], ["view"], ["import"]]
ERRORS = [
    (["run", "--domain", "nope", "--out", "{tmp}/x"], "unknown domain 'nope'", "x"),
    (["score", "/nonexistent"], "/nonexistent", None),
    (["continue", "/nonexistent", "--out", "{tmp}/y"], "/nonexistent is not a run directory", "y"),
    (["report", "/nonexistent", "--out", "{tmp}/z"], "/nonexistent is not a run directory", "z"),
    (["audit", "/nonexistent"], "/nonexistent is not a run directory", None),
    (["view", "/nonexistent"], "/nonexistent does not exist", None),
    (["view", "{tmp}/afile"], "afile is a file, not a run directory", None),
    (["run", "--domain", "hotpotqa", "--tasks", "1", "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1",
      "--index-dir", "{tmp}/afile", "--out", "{tmp}/h"], "--index-dir", "h"),
    (["run", "--domain", "arithmetic", "--tasks", "1", "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1",
      "--ray-address", "auto", "--out", "{tmp}/r"], "--ray-address needs --backend ray", "r"),
    (["run", "--domain", "arithmetic", "--tasks", "1", "--model", "local:smollm2", "--backend", "ray",
      "--ray-address", "auto", "--out", "{tmp}/l"], "is served on this machine only", "l"),
    (["run", "--domain", "arithmetic", "--tasks", "2", "--samples", "2", "--stop-on-consensus", "0.1", "--model",
      "openai/x", "--api-base", "http://127.0.0.1:9/v1", "--backend", "ray", "--out", "{tmp}/s"],
     "--stop-on-consensus schedules samples", "s"),
]


@pytest.mark.parametrize(
    "kind,argv,fragment,created",
    [("help", [*a, "--help"], None, None) for a in HELP]
    + [("no-args", [], None, None)]
    + [("error", a, f, c) for a, f, c in ERRORS],
    ids=[f"help-{a[0] if a else 'uqh'}" for a in HELP] + ["no-args"] + [f"error-{a[0]}-{i}" for i, (a, _, _) in enumerate(ERRORS)],
)
def test_cli_help_and_one_line_errors(kind, argv, fragment, created, tmp_path):
    (tmp_path / "afile").write_text("not a directory\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc, out, err, heavy = _uqh(argv, tmp_path)
    assert "Traceback" not in out + err
    if kind == "help":
        assert rc == 0 and out.startswith(f"usage: uqh {argv[0] if len(argv) > 1 else ''}".rstrip())
        assert "options:" in out and err == ""
        assert heavy == []  # help stays fast: no command module imports litellm/tau2/bm25s/numpy at top level
        return
    if kind == "no-args":
        assert rc == 2 and out == "" and err.startswith("usage: uqh") and "Trajectory Proper Score" in err
        assert all(f"    {c} " in err for c in ("run", "continue", "score", "audit", "report", "index"))
        return
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"uqh {argv[0]}: error: ") and fragment in lines[0]
    if created:
        assert not (tmp_path / created).exists()  # nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_run_help_lists_the_domain_option_flag_and_how_to_list_options(tmp_path):
    rc, out, err, heavy = _uqh(["run", "--help"], tmp_path)
    assert rc == 0 and heavy == [] and err == ""
    assert "-D KEY=VALUE, --domain-option KEY=VALUE" in out and "--list-options" in out
    assert "uqh run --domain NAME --list-options" in out  # the epilog says how to see a domain's options
