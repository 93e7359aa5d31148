"""The import graph is a DAG that shows the data flow, and only `rundir` reads run-directory files.

    rundir  <-  domains  <-  harness            (write path: loop, runner, store, continuation, model client)
    rundir  <-  scoring  <-  reports

Every import statement of every module is read (function-level imports included: a lazy import is still an
edge). docs/architecture.md draws the same graph.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rundir", "domains", "harness", "scoring", "reports")
#: harness modules that are not the write path: the CLI and its per-command modules may compose every part.
HARNESS_COMMANDS = {"harness.cli", "harness.run_command", "harness.continue_command", "harness.judge_command",
                    "harness.certify_command", "harness.export_command"}
FORBIDDEN = {
    "rundir": set(PACKAGES) - {"rundir"},
    "domains": {"harness", "scoring", "reports"},
    "scoring": {"harness", "domains", "reports"},
    "reports": {"harness", "domains"},
}
RUN_FILES = {"episodes.jsonl", "logprobs.jsonl", "manifest.json"}
RUN_FILE_NAMES = {"EPISODES_FILE", "SIDECAR_FILE", "MANIFEST_FILE"}


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = module.split(".")
                if not path.name == "__init__.py":
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
    return {m for m in out if m.split(".")[0] in PACKAGES}


MODULES = dict(_modules())


def test_every_package_found():
    assert {m.split(".")[0] for m in MODULES} == set(PACKAGES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_import_directions(module):
    pkg = module.split(".")[0]
    imported = _imports(module, MODULES[module])
    targets = {m.split(".")[0] for m in imported}
    bad = targets & FORBIDDEN.get(pkg, set())
    assert not bad, f"{module} imports {sorted(m for m in imported if m.split('.')[0] in bad)}"
    if pkg == "harness" and module not in HARNESS_COMMANDS:
        wrong = sorted(m for m in imported if m.split(".")[0] in ("scoring", "reports"))
        assert not wrong, f"harness write-path module {module} imports {wrong}"


def test_package_graph_is_acyclic():
    edges = {p: set() for p in PACKAGES}
    for module, path in MODULES.items():
        pkg = module.split(".")[0]
        for target in _imports(module, path):
            t = target.split(".")[0]
            if t != pkg:
                edges[pkg].add(t)
    state: dict[str, int] = {}

    def visit(p: str, trail: list[str]) -> None:
        if state.get(p) == 1:
            raise AssertionError(f"import cycle: {' -> '.join(trail + [p])}")
        if state.get(p) == 2:
            return
        state[p] = 1
        for q in sorted(edges[p]):
            visit(q, trail + [p])
        state[p] = 2

    for p in PACKAGES:
        visit(p, [])


def _mentions_run_file(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value in RUN_FILES:
            return True
        if isinstance(sub, ast.Name) and sub.id in RUN_FILE_NAMES:
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in RUN_FILE_NAMES:
            return True
    return False


def _reads(call: ast.Call) -> ast.AST | None:
    """The expression naming the file a call reads, or None when the call does not read a file."""
    func = call.func
    mode = None
    if isinstance(func, ast.Name) and func.id == "open":
        target = call.args[0] if call.args else None
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    elif isinstance(func, ast.Attribute) and func.attr in ("read_text", "read_bytes"):
        return func.value
    elif isinstance(func, ast.Attribute) and func.attr == "open":
        target = func.value
        mode = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "mode"), None)
    else:
        return None
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(c in mode.value for c in "aw"):
        return None  # appending / writing
    return target


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith("rundir")))
def test_only_rundir_reads_run_files(module):
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            target = _reads(node)
            if target is not None and _mentions_run_file(target):
                pytest.fail(f"{module}:{node.lineno} reads a run-directory file directly; use rundir.RunDir")


def test_the_checker_catches_a_direct_read():
    bad = ast.parse('json.loads((run_dir / "manifest.json").read_text())\nopen(p / EPISODES_FILE)\n')
    calls = [n for n in ast.walk(bad) if isinstance(n, ast.Call) and _reads(n) is not None]
    assert len(calls) == 2 and all(_mentions_run_file(_reads(c)) for c in calls)
    ok = ast.parse('open(run_dir / EPISODES_FILE, "ab")\n')
    assert not [n for n in ast.walk(ok) if isinstance(n, ast.Call) and _reads(n) is not None]
