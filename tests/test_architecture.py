"""The import graph is a DAG that shows the data flow, at the level of packages and of files.

    uqh.rundir  <-  uqh.domains  <-  uqh.harness      (write path: model, store, episode, sampling, config,
                                                        backends, runner, continuation)
    uqh.rundir  <-  uqh.scoring  <-  uqh.reports
    uqh.cli on top: the only package that composes the others; every command module lives there.

Every import statement of every module is read (function-level imports included: a lazy import is still an
edge). docs/architecture.md draws the same graph.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "uqh"
#: uqh's subpackages; the top-level modules of the repository are only ``uqh``.
PACKAGES = ("rundir", "prompts", "domains", "harness", "scoring", "reports", "cli")
FORBIDDEN = {
    "rundir": set(PACKAGES) - {"rundir"},
    "prompts": set(PACKAGES) - {"prompts"},
    "domains": {"harness", "scoring", "reports", "cli"},
    "harness": {"scoring", "reports", "cli"},
    "scoring": {"harness", "domains", "reports", "cli", "prompts"},
    "reports": {"harness", "domains", "cli", "prompts"},
    "cli": set(),
}
#: Inside the write path, each part imports only parts of a lower rank (and itself).
HARNESS_RANK = {
    "interrupts": 0, "model": 1, "store": 1, "progress": 1, "episode": 2, "importers": 2, "sampling": 3, "config": 4,
    "backends": 5, "judge": 5, "probes": 6, "runner": 6, "continuation": 7, "launch": 7, "doctor": 2,
    "regenerate": 8,
}
#: Modules (besides the store) that append to files: the judge's own directory (not a run directory).
APPENDERS = {"uqh.harness.store.writer", "uqh.harness.store.repair", "uqh.harness.judge.judge_runner"}
#: Modules in uqh/cli that are not commands: the entry point and the pieces every command shares.
CLI_SHARED = {"uqh.cli", "uqh.cli.__main__", "uqh.cli.arg_types", "uqh.cli.console_log", "uqh.cli.arguments"}
RUN_FILES = {"episodes.jsonl", "logprobs.jsonl", "manifest.json", "user_logprobs.jsonl"}
RUN_FILE_NAMES = {"EPISODES_FILE", "SIDECAR_FILE", "MANIFEST_FILE", "USER_SIDECAR_FILE"}


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


MODULES = dict(_modules())


def _resolve(name: str) -> str | None:
    """The most specific module of ours that ``name`` (a module or ``module.attribute``) refers to."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _import_nodes(module: str, path: Path):
    """(node, imported module, imported names) for every import statement, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node, a.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if path.name != "__init__.py":
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            yield node, name, [a.name for a in node.names]


def _edges(module: str, path: Path) -> set[str]:
    """The modules of ours that ``module`` imports (``from pkg import submodule`` is an edge to the submodule)."""
    out = set()
    for _node, name, names in _import_nodes(module, path):
        if names:
            for n in names:
                target = _resolve(f"{name}.{n}")
                if target:
                    out.add(target)
        elif _resolve(name):
            out.add(_resolve(name))
    out.discard(module)
    return out


EDGES = {m: _edges(m, p) for m, p in MODULES.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_one_top_level_package():
    tops = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"}
    assert tops == {"uqh"}, f"top-level packages besides uqh: {sorted(tops - {'uqh'})}"
    assert {_package(m) for m in MODULES} - {""} == set(PACKAGES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_import_directions(module):
    pkg = _package(module)
    bad = sorted(t for t in EDGES[module] if _package(t) in FORBIDDEN.get(pkg, set()))
    assert not bad, f"{module} imports {bad}"
    if module == "uqh":
        assert not EDGES[module], "uqh/__init__.py imports nothing of ours"


def _harness_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "harness" else None


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _harness_part(m)))
def test_harness_layers(module):
    part = _harness_part(module)
    for target in EDGES[module]:
        other = _harness_part(target)
        if other is None or other == part:
            continue
        assert HARNESS_RANK[other] < HARNESS_RANK[part], (
            f"{module} ({part}, rank {HARNESS_RANK[part]}) imports {target} ({other}, rank {HARNESS_RANK[other]})")


def test_every_harness_part_is_ranked():
    assert {_harness_part(m) for m in MODULES} - {None} == set(HARNESS_RANK)


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(edges):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_file_graph_is_acyclic():
    cycle = _cycle(EDGES)
    assert cycle is None, "import cycle between files: " + " -> ".join(cycle)


def test_package_graph_is_acyclic():
    pkg_edges: dict[str, set[str]] = {}
    for m, targets in EDGES.items():
        pkg_edges.setdefault(_package(m), set()).update(_package(t) for t in targets if _package(t) != _package(m))
    cycle = _cycle(pkg_edges)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_from_another_module(module):
    for node, name, names in _import_nodes(module, MODULES[module]):
        if _resolve(name) is None:
            continue
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{module}:{node.lineno} imports private {private} from {name}"


def test_command_modules_live_in_cli():
    outside = sorted(m for m in MODULES if m.endswith("_command") and _package(m) != "cli")
    assert not outside, f"command modules outside uqh/cli: {outside}"
    commands = sorted(m for m in MODULES if _package(m) == "cli" and m not in CLI_SHARED)
    assert commands and all(m.endswith("_command") for m in commands), commands


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _package(m) == "cli" and m not in CLI_SHARED))
def test_command_modules_do_not_import_each_other(module):
    siblings = sorted(t for t in EDGES[module] if _package(t) == "cli" and t not in CLI_SHARED)
    assert not siblings, f"{module} imports another command module: {siblings} (shared parts go in uqh.cli.arguments)"


def _appends(tree: ast.AST) -> list[int]:
    """Line numbers of calls that open a file for appending (``open(p, "a…")``, ``p.open("a…")``, O_APPEND)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "O_APPEND":
            lines.append(node.lineno)
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            mode = node.args[1] if len(node.args) > 1 else None
        elif isinstance(func, ast.Attribute) and func.attr == "open":
            mode = node.args[0] if node.args else None
        else:
            continue
        mode = mode or next((k.value for k in node.keywords if k.arg == "mode"), None)
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and "a" in mode.value:
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m not in APPENDERS))
def test_only_the_store_appends(module):
    found = _appends(ast.parse(MODULES[module].read_text()))
    assert not found, f"{module} appends to a file at lines {found}; run-directory writes go through RunStore"


def test_the_append_checker_catches_each_form():
    tree = ast.parse('open(p, "ab")\np.open(mode="a")\nos.open(p, os.O_WRONLY | os.O_APPEND)\nopen(p, "wb")\n'
                     'validator(mode="after")\n')
    assert _appends(tree) == [1, 2, 3]


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


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _package(m) != "rundir"))
def test_only_rundir_names_run_files(module):
    """Only rundir reads run-directory files, and only rundir spells their names (others ask rundir)."""
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            target = _reads(node)
            if target is not None and _mentions_run_file(target):
                pytest.fail(f"{module}:{node.lineno} reads a run-directory file directly; use uqh.rundir.RunDir")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in RUN_FILES:
            pytest.fail(f"{module}:{node.lineno} spells the run-directory file name {node.value!r}; "
                        "use the constant from uqh.rundir.schema")


def test_the_checker_catches_a_direct_read():
    bad = ast.parse('json.loads((run_dir / "manifest.json").read_text())\nopen(p / EPISODES_FILE)\n')
    calls = [n for n in ast.walk(bad) if isinstance(n, ast.Call) and _reads(n) is not None]
    assert len(calls) == 2 and all(_mentions_run_file(_reads(c)) for c in calls)
    ok = ast.parse('open(run_dir / EPISODES_FILE, "ab")\n')
    assert not [n for n in ast.walk(ok) if isinstance(n, ast.Call) and _reads(n) is not None]
