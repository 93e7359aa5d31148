"""Continuations of censored prefixes (Appendix H): Monte Carlo branches, q_Z estimates and the audit.

``uqh continue`` runs, for every administratively censored (``max_steps``) episode of a source run (or a chosen
subset), ``M`` independent continuation branches under the same model, prompt, decoding and repair rules:

1. **Replay check.** A fresh environment is reset and the recorded actions are replayed
   (:meth:`uqh.domains.base.Environment.replay`); the reset's first message must equal the recorded task prompt and
   every replayed observation the recorded one. A prefix that cannot be replayed faithfully is written to
   ``skipped_prefixes.jsonl`` in the continuation run directory, printed, and never continued.
2. **Branches.** Each branch is an ordinary :class:`uqh.rundir.schema.Episode` with id ``<source_id>@b<k>``,
   ``source_episode_id``, ``branch_index`` and ``prefix_steps = Z``; its first ``Z`` steps are the source steps
   copied verbatim (the source forecasts are never altered) and the conversation is rebuilt from the record by
   :func:`uqh.harness.episode.loop.build_messages` (no model call for the prefix). Its step budget is ``Z + K``. Its decoding
   seed is ``derive_seed(run seed, "<source_id>@b<k>")``: deterministic in (run seed, episode, branch).
   Branches are written by the batch runner, so the continuation directory is resumable and crash-safe like
   any run; its manifest's ``RunConfig.continuation`` records the source run directory, the source config hash,
   ``branches``, ``extra_steps`` and the continued prefix ids. A larger ``branches`` resumes it too, keeping the
   finished branches (:func:`check_resume`). The source run directory is only read.
   With ``--stop-rule ci:H`` (:mod:`uqh.harness.sampling.branch_rules`) the branches run in rounds and a prefix stops once its
   interval for q_Z is narrow enough (:func:`run_rounds`); branch k is the same episode under every rule.
3. **q_Z** is not computed here (the write path never imports scoring): :func:`uqh.scoring.qz.run_estimate.estimate_qz`
   reads the finished continuation run directory, and ``uqh.reports.continuation_audit`` writes ``qz.jsonl`` and the
   Table 7/8-shaped audit.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from uqh.domains.base import ReplayMismatch, Runtime
from uqh.harness.config.build import build_domain, check_endpoint_list, preflight
from uqh.harness.episode.agent_registry import agent_system_prompt
from uqh.harness.episode.loop import Branch, EpisodeSpec, branch_episode_id, derive_seed, open_episode
from uqh.harness.config.settings import BatchSettings
from uqh.harness.model.llama_server import resolve_model
from uqh.harness.runner import run_batch
from uqh.harness.sampling.branch_rules import FIXED, StopRule, decide, parse_stop_rule, resolved_outcome
from uqh.harness.store import lock as run_lock
from uqh.harness.store.writer import RunStore, check_out_dir, check_resumable, write_records_file
from uqh.rundir.errors import UserError
from uqh.rundir.reader import RunDir, is_run_dir
from uqh.rundir.schema import (
    SKIPPED_FILE,
    STOP_FILE,
    Episode,
    Manifest,
    RunConfig,
    SkippedPrefix,
    StopDecision,
    StopReason,
)


# ------------------------------------------------------------------------------------------ source run


def load_source(run_dir: Path) -> tuple[Manifest, list[Episode]]:
    source = RunDir.open(run_dir)
    if source.is_continuation:
        raise UserError(f"{run_dir} is itself a continuation run; pass the source run directory")
    return source.manifest, source.episodes()


@dataclass(frozen=True)
class PrefixSample:
    """A seeded random sample of ``n`` censored prefixes (Appendix H.2: the paper samples its 100 prefixes)."""

    n: int
    seed: int = 0

    def record(self, population: int) -> dict[str, Any]:
        """What the continuation manifest records: the method, the size asked for, the seed, how many censored
        prefixes it was drawn from and how many were drawn (all of them when ``n`` exceeds the population)."""
        return {"method": "random", "n": self.n, "seed": self.seed, "population": population,
                "drawn": min(self.n, population)}


def sample_prefixes(censored: Sequence[Episode], sample: PrefixSample) -> list[Episode]:
    """``sample.n`` of ``censored`` (in canonical order) drawn without replacement by ``random.Random(seed)``, kept
    in canonical order; all of them when ``n`` is at least their number. The draw depends only on the seed and on
    the canonical order of the censored episodes, so the same command draws the same prefixes on resume."""
    import random

    if sample.n < 1:
        raise UserError("--sample must be at least 1")
    if sample.n >= len(censored):
        return list(censored)
    chosen = sorted(random.Random(sample.seed).sample(range(len(censored)), sample.n))
    return [censored[i] for i in chosen]


def select_prefixes(
    manifest: Manifest, episodes: Sequence[Episode], *, n: int | None = None, ids: Sequence[str] | None = None,
    sample: PrefixSample | None = None,
) -> list[Episode]:
    """The censored prefixes to continue, in the source run's canonical order (task order, then sample index).

    ``ids``: exactly these episodes (each must exist and have stopped on ``max_steps``); else ``sample``: a seeded
    random sample of the ``max_steps`` episodes (:func:`sample_prefixes`); else the first ``n`` ``max_steps``
    episodes (all when ``n`` is None).
    """
    by_id = {ep.episode_id: ep for ep in episodes}
    if ids:
        out = []
        for eid in dict.fromkeys(ids):
            ep = by_id.get(eid)
            if ep is None:
                raise UserError(f"--ids: episode {eid!r} is not in the source run; list ids with the run's episodes.jsonl")
            if ep.stop_reason != StopReason.max_steps:
                raise UserError(
                    f"--ids: episode {eid!r} stopped with {ep.stop_reason.value}, not max_steps; only censored "
                    "prefixes can be continued"
                )
            out.append(ep)
        return sorted(out, key=manifest.config.episode_sort_key())
    if n is not None and n < 1:
        raise UserError("--prefixes must be at least 1")
    censored = sorted(
        (ep for ep in episodes if ep.stop_reason == StopReason.max_steps and ep.source_episode_id is None),
        key=manifest.config.episode_sort_key(),
    )
    if not censored:
        raise UserError("the source run has no max_steps episodes; there is nothing to continue")
    if sample is not None:
        return sample_prefixes(censored, sample)
    return censored if n is None else censored[:n]


def censored_population(episodes: Sequence[Episode]) -> int:
    """The number of censored (``max_steps``) source episodes a prefix sample is drawn from."""
    return sum(1 for ep in episodes if ep.stop_reason == StopReason.max_steps and ep.source_episode_id is None)


def continuation_config(
    source: Manifest,
    source_run_dir: Path,
    prefixes: Sequence[Episode],
    *,
    branches: int,
    extra_steps: int,
    api_base: str | Sequence[str] | None = None,
    stop_rule: StopRule = FIXED,
    selection: dict[str, Any] | None = None,
) -> RunConfig:
    """The continuation run's config: the source config (same model, prompt, decoding, domain options) with a
    step budget of ``Z + K`` and ``continuation`` recording source run, source config hash, M, K and the prefixes.

    ``api_base``: the endpoint (a URL) or endpoints (a list) to use instead of the source run's.
    A sequential ``stop_rule`` adds ``stop_rule`` and its ``rounds`` (so resuming with another rule is refused);
    the fixed design adds nothing, so its config and hash are what they were before stop rules existed.
    ``selection`` (:meth:`PrefixSample.record`) records a random prefix sample as ``continuation["selection"]``;
    first-N and ``--ids`` selections add nothing (their config and hash are unchanged)."""
    if branches < 1:
        raise UserError("--branches must be at least 1")
    if extra_steps < 1:
        raise UserError("--extra-steps must be at least 1")
    cfg = source.config
    update: dict[str, Any] = {
        "task_ids": list(dict.fromkeys(ep.task_id for ep in prefixes)),
        "step_budget": cfg.step_budget + extra_steps,
        "continuation": {
            "source_run_dir": str(Path(source_run_dir).resolve()),
            "source_config_hash": source.config_hash,
            "branches": branches,
            "extra_steps": extra_steps,
            "prefix_ids": [ep.episode_id for ep in prefixes],
        },
    }
    if not stop_rule.is_fixed:
        update["continuation"].update(stop_rule=stop_rule.text, rounds=stop_rule.rounds(branches))
    if selection is not None:
        update["continuation"]["selection"] = dict(selection)
    urls = [api_base] if isinstance(api_base, str) else list(api_base or ())
    if urls:  # the endpoint(s) replace the source run's (one: api_base only, as before; several: api_bases too)
        update["api_base"] = urls[0]
        update["api_bases"] = urls if len(urls) > 1 else None
    return cfg.model_copy(update=update, deep=True)


def branch_seed(run_seed: int, source_episode_id: str, branch_index: int) -> int:
    """Decoding seed of branch k of a prefix: ``derive_seed(run_seed, "<source_id>@b<k>")``."""
    return derive_seed(run_seed, branch_episode_id(source_episode_id, branch_index))


def branch_spec(config: RunConfig, prefix: Episode, k: int):
    """The :class:`uqh.harness.episode.loop.EpisodeSpec` of branch ``k`` of ``prefix``: a :class:`uqh.harness.episode.loop.Branch` of the
    source episode (its steps copied), step budget ``Z + K``. The same episode whichever stop rule runs it."""
    return EpisodeSpec(
        episode_id=branch_episode_id(prefix.episode_id, k),
        task_id=prefix.task_id,
        sample_index=prefix.sample_index,
        seed=branch_seed(config.decoding.seed, prefix.episode_id, k),
        step_budget=len(prefix.steps) + config.continuation["extra_steps"],
        start=Branch(prefix, index=k),
    )


def branch_specs(config: RunConfig, prefixes: Sequence[Episode], branches: int, *, first: int = 0) -> list:
    """Branches ``first .. branches-1`` of every prefix (:func:`branch_spec`), grouped by prefix (so a single-slot
    llama.cpp server reuses a prefix's KV cache across its branches)."""
    return [branch_spec(config, ep, k) for ep in prefixes for k in range(first, branches)]


# ------------------------------------------------------------------------------------------ replay check


def make_domain(config: RunConfig, *, system_prompt: str | None = None):
    """The domain built exactly as the run of ``config`` built it (``uqh.harness.config.build.build_domain``: its domain,
    split, domain_options and observation_chars). With ``system_prompt`` (the source manifest's), a domain whose
    prompt text differs (prompt file, data or options changed since) is a UserError: branches must continue the
    conversation the prefixes were recorded in."""
    domain = build_domain(config)
    if system_prompt is not None and agent_system_prompt(domain, config.agent) != system_prompt:
        split = f" split {config.split}" if config.split is not None else ""
        raise UserError(
            f"the {config.domain}{split} system prompt rebuilt from the source run's config differs from the one "
            "recorded in its manifest; restore the prompt file / data the source run used"
        )
    return domain


def env_seed_for(config: RunConfig, episode: Episode) -> int:
    """The environment seed the source run used for ``episode`` (its own derived seed)."""
    return derive_seed(config.decoding.seed, episode.episode_id)


async def check_replay(domain, config: RunConfig, episode: Episode) -> str | None:
    """Replay ``episode``'s recorded actions into a fresh environment; the mismatch reason, or None if faithful.

    The environment is opened as a branch's is (:func:`uqh.harness.episode.loop.open_episode`, with the source episode's
    own seed); this only turns its outcome into a reason.
    """
    if not type(domain).supports_replay:
        return f"domain {config.domain} does not support replay"
    if len(episode.steps) != config.step_budget:
        return f"prefix has {len(episode.steps)} steps but the source step budget is {config.step_budget}"
    spec = EpisodeSpec(
        episode_id=episode.episode_id,
        task_id=episode.task_id,
        sample_index=episode.sample_index,
        seed=env_seed_for(config, episode),
        start=Branch(episode),
    )
    try:
        env, _, _ = await open_episode(domain, spec)
    except ReplayMismatch as exc:
        return f"replay mismatch: {exc}"
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. a recorded action the environment now rejects
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return f"replay failed: {type(exc).__name__}: {first}"
    env.close()
    return None


async def check_replays(domain, config: RunConfig, prefixes: Sequence[Episode]) -> list[SkippedPrefix]:
    skipped = []
    try:
        for ep in prefixes:
            reason = await check_replay(domain, config, ep)
            if reason is not None:
                skipped.append(SkippedPrefix(episode_id=ep.episode_id, reason=reason))
    finally:
        await domain.aclose()  # e.g. Tau2's user sessions, bound to this event loop
    return skipped


# ------------------------------------------------------------------------------------------ running branches


@dataclass
class ContinueReport:
    out_dir: Path
    n_prefixes: int
    skipped: list[SkippedPrefix]
    n_branches_planned: int
    n_branches_written: int
    summary: Any = None
    stop_rule: str = "fixed"
    #: Sequential rules: where each continued prefix was left (``stop_decisions.jsonl``).
    decisions: list[StopDecision] = field(default_factory=list)
    #: Branches the fixed design would run on the same prefixes (prefixes x ``--branches``).
    n_branches_max: int = 0
    #: The ``--branches`` the run directory recorded when this call resumed it with a larger one (else None).
    grown_from: int | None = None

    @property
    def n_branches_missing(self) -> int:
        return self.n_branches_planned - self.n_branches_written


def check_resume(out_dir: Path, config_at: Callable[[int], RunConfig], branches: int) -> int:
    """The ``--branches`` M recorded in ``out_dir``'s manifest, when ``out_dir`` can be resumed with ``branches``;
    UserError, nothing written, otherwise. ``config_at(m)``: this continuation's config with M = ``m``.

    Resuming needs the same config (:func:`uqh.harness.store.writer.check_resumable` names the fields that differ), except
    that M may grow: branch k of a prefix is the same episode at every M (:func:`branch_spec`), so the finished
    branches are branches 0 .. M-1 of the larger run (a sequential rule's rounds below the recorded M are the same
    at every larger M: :meth:`uqh.harness.sampling.branch_rules.StopRule.rounds`). A smaller M is refused: the directory holds
    branches beyond it, which q_Z would average."""
    recorded = (RunDir.open(out_dir).config.continuation or {}).get("branches")
    if not isinstance(recorded, int) or recorded == branches:
        check_resumable(out_dir, config_at(branches))
        return branches
    check_resumable(out_dir, config_at(recorded))  # all else as recorded, or the fields that differ are named
    if branches < recorded:
        raise UserError(
            f"{out_dir} holds a continuation with --branches {recorded}; it cannot be resumed with fewer "
            f"({branches}), as it may hold branches beyond them: re-run with --branches {recorded} or more "
            "(the finished branches are kept), or use a new --out directory"
        )
    return recorded


def _record_more_branches(store, config: RunConfig) -> None:
    """Record the larger M of ``config`` in the manifest of ``store`` (open, holding the lock): its config and
    hash, and the earlier M in ``info["branches_grown_from"]``."""
    before = store.manifest.config.continuation["branches"]
    store.replace_config(config, branches_grown_from=[*store.manifest.info.get("branches_grown_from", []), before])


def _inside(path: Path, root: Path) -> bool:
    path, root = path.resolve(), root.resolve()
    return path == root or root in path.parents


def run_continuations(
    source_dir: Path,
    out_dir: Path,
    *,
    branches: int,
    extra_steps: int | None = None,
    n_prefixes: int | None = None,
    ids: Sequence[str] | None = None,
    api_base: str | Sequence[str] | None = None,
    settings: BatchSettings = BatchSettings(),
    client_factory=None,
    lock_scope: contextlib.ExitStack | None = None,
    stop_rule: str | StopRule = FIXED,
    backend: Any = None,
    sample: PrefixSample | None = None,
) -> ContinueReport:
    """Replay-check the selected censored prefixes of ``source_dir`` and run ``branches`` continuation branches of
    each faithful one into ``out_dir`` (created, or resumed when it holds the same continuation config or the same
    with fewer branches: :func:`check_resume`; the manifest then records the larger M, the finished branches are
    kept).

    ``extra_steps`` defaults to the source step budget. The source directory is only read. ``stop_rule``
    (:mod:`uqh.harness.sampling.branch_rules`): ``fixed`` runs all ``branches`` at once; ``ci:H`` runs them in rounds and stops
    a prefix early (:func:`run_rounds`), ``branches`` being the maximum. ``out_dir``'s writer lock is taken before
    the first write and held until ``lock_scope`` closes (default: until this returns), so a caller that writes
    more (the q_Z file) keeps it. ``settings``: how the branches run, as a batch of :func:`uqh.harness.runner.run_batch`
    (concurrency, processes, the model client's timeout and retries); ``backend``: where.
    ``sample``: continue a seeded random sample of the censored prefixes instead of the first ``n_prefixes``
    (recorded in the manifest's ``continuation["selection"]``).
    """
    plan = plan_continuations(source_dir, out_dir, branches=branches, extra_steps=extra_steps,
                              n_prefixes=n_prefixes, ids=ids, api_base=api_base, stop_rule=stop_rule, sample=sample)
    if backend is not None:
        backend.check(plan.config)
    domain = make_domain(plan.manifest.config, system_prompt=plan.manifest.system_prompt)  # as the source built it
    skipped = _replay_check(domain, plan)
    skipped_ids = {s.episode_id for s in skipped}
    keep = [ep for ep in plan.prefixes if ep.episode_id not in skipped_ids]
    with contextlib.ExitStack() as own_scope:
        grown_from = _open_out_dir(plan, domain, skipped, lock_scope if lock_scope is not None else own_scope)
        if backend is not None:  # one connection (or local Ray instance) for every round
            own_scope.enter_context(backend)
        if not plan.rule.is_fixed:
            report = run_rounds(plan.config, plan.out_dir, keep, plan.rule, n_prefixes=len(plan.prefixes),
                                skipped=skipped, settings=settings, client_factory=client_factory, backend=backend)
            report.grown_from = grown_from
            return report
        specs = branch_specs(plan.config, keep, branches)
        summary = None
        if specs:
            summary = run_batch(plan.config, plan.out_dir, settings, specs=specs, client_factory=client_factory,
                                progress_label="uqh continue", backend=backend)
        planned = {s.episode_id for s in specs}
        written = sum(1 for ep in RunDir.open(plan.out_dir).episodes() if ep.episode_id in planned)
        return ContinueReport(out_dir=plan.out_dir, n_prefixes=len(plan.prefixes), skipped=skipped,
                              n_branches_planned=len(specs), n_branches_written=written, summary=summary,
                              n_branches_max=len(specs), grown_from=grown_from)


@dataclass
class ContinuationPlan:
    """What a continuation will run, checked before anything is written: the source, the selected prefixes, the
    config (at the requested M, and at any M for resume checks), the branch rule."""

    source_dir: Path
    out_dir: Path
    manifest: Manifest
    prefixes: list[Episode]
    rule: StopRule
    config_at: Callable[[int], RunConfig]
    config: RunConfig
    #: The M the out directory records (the requested M for a new one; a smaller one when it grows).
    recorded: int


def plan_continuations(source_dir: Path, out_dir: Path, *, branches: int, extra_steps: int | None,
                       n_prefixes: int | None, ids: Sequence[str] | None, api_base: str | Sequence[str] | None,
                       stop_rule: str | StopRule, sample: PrefixSample | None) -> ContinuationPlan:
    """Select the prefixes and build the continuation config; refuse (UserError) a bad source, an ``--out``
    inside it, an out directory another process writes, or one holding a different continuation."""
    source_dir, out_dir = Path(source_dir), Path(out_dir)
    check_endpoint_list([api_base] if isinstance(api_base, str) else list(api_base or ()))
    manifest, episodes = load_source(source_dir)
    if _inside(out_dir, source_dir) or _inside(source_dir, out_dir):
        raise UserError("--out must be a directory outside the source run directory (the source is never modified)")
    rule = stop_rule if isinstance(stop_rule, StopRule) else parse_stop_rule(stop_rule)
    prefixes = select_prefixes(manifest, episodes, n=n_prefixes, ids=ids, sample=sample)
    selection = sample.record(censored_population(episodes)) if sample is not None and not ids else None
    k = manifest.config.step_budget if extra_steps is None else extra_steps

    def config_at(m: int) -> RunConfig:
        return continuation_config(manifest, source_dir, prefixes, branches=m, extra_steps=k, api_base=api_base,
                                   stop_rule=rule, selection=selection)

    config = config_at(branches)
    preflight(config)  # a local model's GGUF and binary, an API model's key: before anything is written
    check_out_dir(out_dir)  # also refuses, naming it, another process writing out_dir
    recorded = branches
    if is_run_dir(out_dir):  # resume refuses a different config: check now, before any replay work
        recorded = check_resume(out_dir, config_at, branches)
    return ContinuationPlan(source_dir, out_dir, manifest, list(prefixes), rule, config_at, config, recorded)


def _replay_check(domain, plan: ContinuationPlan) -> list[SkippedPrefix]:
    """The prefixes that do not replay faithfully (with the user simulator resolved where the domain needs it)."""
    with contextlib.ExitStack() as stack:
        runtime: Runtime = {"run_dir": plan.out_dir}
        config = plan.config
        if config.user_model:  # e.g. Tau2: make_env/reset need the user simulator
            user_model, user_base = stack.enter_context(resolve_model(config.user_model, config.user_api_base))
            runtime.update(user_model=user_model, user_api_base=user_base, user_decoding=config.user_decoding)
        domain.prepare_runtime(runtime)
        return asyncio.run(check_replays(domain, plan.manifest.config, plan.prefixes))


def _open_out_dir(plan: ContinuationPlan, domain, skipped: list[SkippedPrefix], scope: contextlib.ExitStack
                  ) -> int | None:
    """Create (or reopen) the continuation run directory and record the skipped prefixes, so they are recorded
    even if the run is interrupted; its writer lock passes from the store to ``scope`` without a gap. Returns the
    M the directory grew from (None: it did not grow)."""
    grown_from = plan.recorded if plan.recorded < plan.config.continuation["branches"] else None
    store = RunStore.open_or_create(plan.out_dir, plan.config_at(plan.recorded),
                                    system_prompt=agent_system_prompt(domain, plan.config.agent),
                                    info=domain.recorded_info())
    try:
        scope.enter_context(run_lock.hold(plan.out_dir))
        if grown_from is not None:  # before any branch of the larger M runs
            _record_more_branches(store, plan.config)
    finally:
        store.close()
    write_records_file(plan.out_dir, SKIPPED_FILE, skipped)
    return grown_from


# ------------------------------------------------------------------------------------------ sequential design


def _finished_branches(out_dir: Path) -> dict[str, Episode]:
    return {ep.episode_id: ep for ep in RunDir.open(out_dir).episodes() if ep.source_episode_id is not None}


def run_rounds(
    config: RunConfig,
    out_dir: Path,
    prefixes: Sequence[Episode],
    rule: StopRule,
    *,
    n_prefixes: int,
    skipped: Sequence[SkippedPrefix] = (),
    settings: BatchSettings = BatchSettings(),
    client_factory=None,
    backend: Any = None,
) -> ContinueReport:
    """The sequential design: branches in rounds (``rule.rounds(M)``: cumulative branches per prefix), a decision
    per open prefix after each round (:func:`uqh.harness.sampling.branch_rules.decide`), ``stop_decisions.jsonl`` rewritten after
    each round.

    Branch ``k`` of a prefix is :func:`branch_spec` ``k``, as in the fixed design, so a sequential run is a prefix
    of the fixed run. A decision reads only branches ``0 .. round target - 1`` from the run directory; a prefix
    whose round lost a branch (model failure) stays open and gets no further round in this call. Re-running
    replays the rounds (finished branches are not run again), runs what is missing and so takes the same
    decisions on the same recorded outcomes -- resume needs no state beyond the episodes. Resumed with a larger M,
    it takes the decisions of a fresh run with that M: the rounds below the old M are the same, so a prefix that
    stopped below it stays stopped, and one that reached it is decided again by the new rounds.
    """
    max_branches = config.continuation["branches"]
    open_prefixes = list(prefixes)
    decisions: dict[str, StopDecision] = {}
    planned_of: dict[str, int] = {}  # branches planned per prefix so far (its last round's target)
    summaries = []
    done = _finished_branches(out_dir)
    planned = 0
    for target in rule.rounds(max_branches):
        specs = branch_specs(config, open_prefixes, target, first=planned)
        # planned before the round runs, so that a round a signal or a write failure stopped counts its branches
        planned_of.update((ep.episode_id, target) for ep in open_prefixes)
        if any(s.episode_id not in done for s in specs):
            summaries.append(run_batch(config, out_dir, settings, specs=specs, client_factory=client_factory,
                                       progress_label="uqh continue", backend=backend))
            done = _finished_branches(out_dir)
            if summaries[-1].stopped is not None:  # a signal or a write failure: no further round
                break
        still_open = []
        for ep in open_prefixes:
            outcomes = []
            for k in range(target):  # contiguous from branch 0: a decision never skips a missing branch
                branch = done.get(branch_episode_id(ep.episode_id, k))
                if branch is None:
                    break
                outcomes.append(resolved_outcome(branch))
            d = decide(rule, ep.episode_id, outcomes, planned=target, max_branches=max_branches)
            decisions[ep.episode_id] = d
            if d.stopped_by is None and len(outcomes) == target:
                still_open.append(ep)
        write_records_file(out_dir, STOP_FILE, [decisions[ep.episode_id] for ep in prefixes if ep.episode_id in decisions])
        open_prefixes, planned = still_open, target
        if not open_prefixes:
            break
    ordered = [decisions[ep.episode_id] for ep in prefixes if ep.episode_id in decisions]
    written = sum(branch_episode_id(eid, k) in done for eid, n in planned_of.items() for k in range(n))
    return ContinueReport(
        out_dir=out_dir,
        n_prefixes=n_prefixes,
        skipped=list(skipped),
        n_branches_planned=sum(planned_of.values()),
        n_branches_written=written,
        summary=summaries[-1] if summaries else None,
        stop_rule=rule.text,
        decisions=ordered,
        n_branches_max=len(prefixes) * max_branches,
    )
