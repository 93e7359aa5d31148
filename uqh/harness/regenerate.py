"""The paper's protocol in one go (`uqh regenerate`): every preset's run, then the continuations of their censored
prefixes, with per-preset options, a quick offline protocol, progress throughout and resume.

A :class:`RegeneratePlan` is typed data: the presets to run, per preset the :class:`RunOverrides` laid on top of it
(``--set PRESET:KEY=VALUE``, :func:`parse_settings`), which runs are continued and how
(:class:`ContinuationSettings`), and where everything goes (``OUT/PRESET``, ``OUT/PRESET-continue``).
:func:`quick_plan` is the ``--quick`` protocol: the four benchmarks on the local model, small enough to finish in
minutes on a laptop.

:func:`check_plan` prepares every run before anything is written (a bad option for the fourth preset fails before
the first runs); :func:`run_plan` then runs the steps one after another in this process -- each preset's run as
``uqh run`` runs it (:mod:`uqh.harness.launch`; finished episodes are skipped), ``run_continuations`` per continued run (finished branches are kept) -- so
calling it again resumes where it stopped and, once everything is done, runs nothing. The combined report is the
command's last step (reports sit beside the harness, not under it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from uqh.harness.config.build import LOCAL_GRAMMAR_MAX_TOKENS, RunOverrides, draft
from uqh.harness.config.presets import PRESETS, expand, get_preset
from uqh.harness.config.settings import BatchSettings, RunSettings
from uqh.harness.continuation import (PrefixSample, censored_population, load_source, plan_continuations,
                                      run_continuations)
from uqh.harness.launch import PreparedRun, execute, prepare
from uqh.rundir.errors import UserError
from uqh.rundir.reader import is_run_dir
from uqh.rundir.schema import RunConfig

#: ``--set all:KEY=VALUE`` applies to every preset of the plan.
ALL = "all"
#: Suffix of a continuation run directory: ``OUT/paper-hotpotqa-continue``.
CONTINUE_SUFFIX = "-continue"
#: The report's folder inside ``OUT`` unless given.
REPORT_DIR = "report-paper"


class ContinuationSettings(BaseModel):
    """Which runs are continued and how (Appendix H.2: a seeded random sample of 100 max-step prefixes of HotpotQA,
    ten branches each, extra steps up to the run's budget)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    presets: list[str] = Field(default=["paper-hotpotqa"], description="the presets whose runs are continued")
    sample: int = Field(100, ge=1, description="censored prefixes drawn per run (all when fewer)")
    seed: int = Field(42, description="seed of the prefix draw")
    branches: int = Field(10, ge=1, description="continuation branches per prefix")
    extra_steps: int | None = Field(None, ge=1, description="extra step budget per branch (None: the run's budget)")


class RegeneratePlan(BaseModel):
    """What `uqh regenerate` runs: see the module docstring."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    presets: list[str] = Field(description="preset names, in the order they run")
    runs: dict[str, RunOverrides] = Field(default_factory=dict, description="per preset: options over the preset")
    continuation: ContinuationSettings = ContinuationSettings()
    out: Path = Field(Path("runs"), description="run directories OUT/PRESET, continuations OUT/PRESET-continue")
    concurrency: int | None = Field(None, ge=1, description="episodes (branches) in flight; None: the runner's default")
    label: str = Field("paper protocol", description="what the plan is, for the report's title")

    def run_dir(self, preset: str) -> Path:
        return self.out / preset

    def continuation_dir(self, preset: str) -> Path:
        return self.out / f"{preset}{CONTINUE_SUFFIX}"

    def continued(self) -> list[str]:
        """The presets of the plan whose runs are continued, in plan order."""
        return [p for p in self.presets if p in self.continuation.presets]


# --------------------------------------------------------------------------------------- the quick protocol
#: ``--quick``: the four benchmarks on the local model with the four-tag grammar. Task counts and budgets are
#: those of scripts/demo_offline.sh (about three minutes for the runs on two cores); budgets this small leave
#: max_steps prefixes for the continuations. WebShop uses synthetic goals: the offline catalog has no
#: items_human_ins.json (the report labels the run so).
QUICK_PRESETS = ["paper-strategyqa", "paper-hotpotqa", "paper-webshop", "paper-tau2-retail"]
QUICK_RUNS: dict[str, dict[str, Any]] = {
    ALL: {"model": "local:smollm2", "decoding": {"max_tokens": LOCAL_GRAMMAR_MAX_TOKENS, "reasoning": False}},
    "paper-strategyqa": {"tasks": 6, "step_budget": 4},
    "paper-hotpotqa": {"tasks": 4, "step_budget": 3},
    "paper-webshop": {"tasks": 3, "step_budget": 3, "domain_options": {"goal_source": "synthetic"}},
    "paper-tau2-retail": {"tasks": 1, "step_budget": 2, "user_model": "local:smollm2"},
}
#: Two prefixes per run, three branches each with the run's budget as extra steps (2 extra steps left every branch
#: of the 135M model unresolved); the report retains a prefix with one resolved branch (QUICK_MIN_VALID).
QUICK_CONTINUATION = {"presets": QUICK_PRESETS, "sample": 2, "seed": 42, "branches": 3}
QUICK_MIN_VALID = 1
QUICK_OUT = Path("runs/quick")


def quick_settings() -> dict[str, dict[str, Any]]:
    """The quick protocol's per-preset options (a copy: safe to modify)."""
    return json.loads(json.dumps(QUICK_RUNS))


# --------------------------------------------------------------------------------------- building a plan
def parse_setting(text: str) -> tuple[str, list[str], Any]:
    """``PRESET:KEY=VALUE`` -> (preset, key path, value). KEY is a :class:`RunOverrides` field, dotted into
    ``decoding.*`` and ``domain_options.*``; ``-D NAME=VALUE`` is short for ``domain_options.NAME=VALUE`` (as
    ``uqh run -D``). VALUE is JSON when it parses (3, true, null), else the string."""
    preset, sep, rest = text.partition(":")
    rest = rest.strip()
    if not sep or not preset or not rest:
        raise UserError(f"--set expects PRESET:KEY=VALUE (e.g. paper-webshop:-D goal_source=synthetic), got {text!r}")
    if rest.startswith("-D"):
        rest = "domain_options." + rest[2:].strip()
    key, sep, value_text = rest.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UserError(f"--set {text!r}: expected KEY=VALUE after {preset}:")
    try:
        value = json.loads(value_text)
    except ValueError:
        value = value_text
    return preset, [k.strip().replace("-", "_") for k in key.split(".")], value


def _put(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for k in path[:-1]:
        node = tree.setdefault(k, {})
        if not isinstance(node, dict):
            raise UserError(f"--set: {'.'.join(path)} sets a field inside {k}, which is not a group of options")
        tree = node
    tree[path[-1]] = value


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def overrides_for(preset: str, *layers: dict[str, dict[str, Any]]) -> RunOverrides:
    """The :class:`RunOverrides` of ``preset``: each layer's ``all`` settings, then its own for the preset (which
    win), layer after layer -- the quick protocol's, then the command line's, so an option the user gives wins
    over the protocol's whether it names the preset or ``all``."""
    tree: dict[str, Any] = {}
    for layer in layers:
        tree = _merged(_merged(tree, layer.get(ALL, {})), layer.get(preset, {}))
    if "out" in tree:
        raise UserError(f"--set {preset}:out is not an option: runs go to --out/PRESET")
    try:
        return RunOverrides.model_validate(tree)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UserError(f"--set {preset}:{where}: {err['msg']} (keys are `uqh run` options: tasks, step_budget, "
                        "model, user_model, decoding.max_tokens, domain_options.NAME, ...)") from None


def build_plan(names: list[str], *, quick: bool = False, settings: list[str] = (), out: Path | None = None,
               continuation: dict[str, Any] | None = None, concurrency: int | None = None) -> RegeneratePlan:
    """The plan of ``names`` (presets or groups; default every paper preset, or the quick protocol's four), the
    quick protocol's options when ``quick``, then ``settings`` (``PRESET:KEY=VALUE``) and ``continuation``'s
    fields (None values left out) on top. Raises UserError for an unknown preset or option."""
    presets: list[str] = []
    for name in names or (QUICK_PRESETS if quick else ["paper-all"]):
        presets += [p for p in expand(name) if p not in presets]
    tree: dict[str, dict[str, Any]] = {}
    for text in settings:
        preset, path, value = parse_setting(text)
        if preset != ALL and preset not in PRESETS:
            get_preset(preset)  # the one-line error naming the known presets
        if preset != ALL and preset not in presets:
            raise UserError(f"--set {text!r}: {preset} is not among the presets run ({', '.join(presets)})")
        _put(tree.setdefault(preset, {}), path, value)
    cont = dict(QUICK_CONTINUATION) if quick else {}
    cont.update({k: v for k, v in (continuation or {}).items() if v is not None})
    for p in cont.get("presets", []):
        get_preset(p)
    try:
        cont_settings = ContinuationSettings.model_validate(cont)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserError(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}") from None
    base = quick_settings() if quick else {}
    return RegeneratePlan(presets=presets, runs={p: overrides_for(p, base, tree) for p in presets},
                          continuation=cont_settings, out=out or (QUICK_OUT if quick else Path("runs")),
                          concurrency=concurrency,
                          label="quick protocol (local model, reduced)" if quick else "paper protocol")


def run_settings(plan: RegeneratePlan, name: str, *, progress: bool = True) -> RunSettings:
    """The :class:`RunSettings` of ``name``'s run: what ``uqh run --preset NAME`` with the plan's options and
    ``--out OUT/NAME`` is given."""
    return RunSettings(preset=name, run=plan.runs[name].model_copy(update={"out": plan.run_dir(name)}),
                       batch=BatchSettings(concurrency=plan.concurrency, progress=progress))


def check_plan(plan: RegeneratePlan, *, progress: bool = True) -> dict[str, PreparedRun]:
    """Every preset's run prepared as ``uqh run`` prepares it (:func:`uqh.harness.launch.prepare`: domain built,
    tasks listed, API keys and a resumed run's config checked) and its continuation directory checked, before
    anything is written. Raises UserError naming the preset."""
    prepared = {}
    for name in plan.presets:
        try:
            prepared[name] = prepare(run_settings(plan, name, progress=progress))
            check_continuation(plan, name, prepared[name].config)
        except UserError as exc:
            raise UserError(f"{name}: {exc}") from None
    return prepared


def check_continuation(plan: RegeneratePlan, name: str, config: RunConfig) -> None:
    """Refuse now (UserError), not after the runs, a continuation directory that holds another continuation than
    the plan's (other --sample/--seed/--branches/--extra-steps). Only when its source run is complete: the
    continuations start after every run has finished, so only then is the draw of prefixes fixed."""
    source, out = plan.run_dir(name), plan.continuation_dir(name)
    if name not in plan.continued() or not is_run_dir(out) or not is_run_dir(source):
        return
    _, episodes = load_source(source)
    if len(episodes) < len(config.task_ids) * config.samples_per_task or not censored_population(episodes):
        return
    c = plan.continuation
    plan_continuations(source, out, branches=c.branches, extra_steps=c.extra_steps, n_prefixes=None, ids=None,
                       api_base=None, stop_rule="fixed", sample=PrefixSample(c.sample, c.seed))


# --------------------------------------------------------------------------------------- running it
@dataclass
class StepResult:
    """What one step did: a preset's run or a run's continuation."""

    kind: Literal["run", "continue"]
    preset: str
    out_dir: Path
    planned: int  # episodes (run) or branches (continuation) of the whole step, resumes included
    finished: int  # of them, finished now (before this call included)
    new: int  # finished by this call
    ok: bool = True
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        what = "episodes" if self.kind == "run" else "branches"
        return (f"{self.kind:<8} {self.preset}: {self.finished} of {self.planned} {what} finished ({self.new} this "
                f"call) in {self.out_dir}" + "".join(f"; {n}" for n in self.notes))


@dataclass
class RegenerateResult:
    steps: list[StepResult] = field(default_factory=list)
    #: Why the plan stopped before its end (None: it ran to the end).
    stopped: str | None = None
    exit_code: int = 0

    @property
    def new_episodes(self) -> int:
        return sum(s.new for s in self.steps)


def run_plan(plan: RegeneratePlan, prepared: dict[str, PreparedRun], *, progress: bool = True,
             announce: Callable[[str], None] = print, client_factory=None) -> RegenerateResult:
    """Run every step of ``plan`` (runs first, each as ``uqh run`` runs it: :func:`uqh.harness.launch.execute`;
    then continuations), announcing each as it starts and ends; resumable (see the module docstring). Stops at the
    first step that does not finish (model failures, an interrupt): its successors would build on missing
    episodes. ``client_factory``: as for ``run_batch`` (tests)."""
    result = RegenerateResult()
    continued = plan.continued()
    n_steps = len(plan.presets) + len(continued)
    settings = BatchSettings(concurrency=plan.concurrency, progress=progress)
    for i, name in enumerate(plan.presets, 1):
        announce(f"[{i}/{n_steps}] run {name} -> {plan.run_dir(name)}")
        summary = execute(prepared[name], client_factory=client_factory).summary
        step = StepResult("run", name, plan.run_dir(name), summary.planned - summary.skipped,
                          summary.finished_before + summary.stats.done, summary.stats.done, ok=summary.ok)
        result.steps.append(step)
        announce(step.text())
        if summary.stopped is not None or not summary.ok:
            cause = summary.stopped
            result.stopped = (f"{name}: {cause.message}; {cause.hint}" if cause is not None else
                              f"{name}: {summary.remaining} episodes not finished")
            result.exit_code = cause.exit_code if cause is not None else 1
            return result
    for j, name in enumerate(continued, len(plan.presets) + 1):
        announce(f"[{j}/{n_steps}] continue {name} -> {plan.continuation_dir(name)}")
        step = continue_step(plan, name, settings, client_factory)
        result.steps.append(step)
        announce(step.text())
        if not step.ok:
            result.stopped, result.exit_code = f"{name}: {step.notes[-1]}", 1
            return result
    return result


def continue_step(plan: RegeneratePlan, name: str, settings: BatchSettings, client_factory=None) -> StepResult:
    """Continue the censored prefixes of ``name``'s run (a seeded sample), or say why there is nothing to do."""
    source, out = plan.run_dir(name), plan.continuation_dir(name)
    _, episodes = load_source(source)
    population = censored_population(episodes)
    if population == 0:
        return StepResult("continue", name, out, 0, 0, 0, notes=["no max_steps episodes: nothing to continue"])
    c = plan.continuation
    report = run_continuations(source, out, branches=c.branches, extra_steps=c.extra_steps,
                               sample=PrefixSample(c.sample, c.seed), settings=settings,
                               client_factory=client_factory)
    new = report.summary.stats.done if report.summary is not None else 0
    notes = [f"{report.n_prefixes} of {population} censored prefixes sampled (seed {c.seed})"]
    if report.skipped:
        notes.append(f"{len(report.skipped)} skipped (not replayable)")
    step = StepResult("continue", name, out, report.n_branches_planned, report.n_branches_written, new, notes=notes)
    stopped = report.summary.stopped if report.summary is not None else None
    if stopped is not None or report.n_branches_missing:
        step.ok = False
        step.notes.append(stopped.message if stopped is not None else
                          f"{report.n_branches_missing} branches not finished (model failures)")
    return step


def report_inputs(plan: RegeneratePlan) -> tuple[list[Path], list[Path], list[str]]:
    """What the combined report covers: the plan's run directories, the run directories of other presets already
    under ``plan.out`` (an earlier call's, so a call with fewer presets does not drop them), and every
    continuation of those runs. Returns (runs, continuations, notes naming the earlier runs)."""
    runs = [plan.run_dir(p) for p in plan.presets if is_run_dir(plan.run_dir(p))]
    earlier = [plan.run_dir(p) for p in PRESETS if p not in plan.presets and is_run_dir(plan.run_dir(p))]
    notes = [f"the report also covers {d}, run by an earlier call" for d in earlier]
    runs += earlier
    conts = [plan.out / f"{d.name}{CONTINUE_SUFFIX}" for d in runs]
    return runs, [c for c in conts if is_run_dir(c)], notes


def continuation_bound(plan: RegeneratePlan) -> list[str]:
    """The dry run's lines on the continuations: per continued preset, prefixes x branches x extra steps (the
    budget from the merged config, :func:`uqh.harness.config.build.draft`: no domain built, no key needed)."""
    c = plan.continuation
    lines = []
    for name in plan.continued():
        k = c.extra_steps or draft(get_preset(name), plan.runs[name]).config.step_budget
        steps = c.sample * c.branches * k
        lines.append(f"continue {name}: <= {c.sample} sampled max-step prefixes (seed {c.seed}) x {c.branches} "
                     f"branches x <= {k} extra steps = <= {steps:,} steps, <= {3 * steps:,} model calls with two "
                     f"repairs per step -> {plan.continuation_dir(name)}")
    return lines
