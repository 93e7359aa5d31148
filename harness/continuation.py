"""Continuations of censored prefixes (Appendix H): Monte Carlo branches, q_Z estimates and the audit.

``uqh continue`` runs, for every administratively censored (``max_steps``) episode of a source run (or a chosen
subset), ``M`` independent continuation branches under the same model, prompt, decoding and repair rules:

1. **Replay check.** A fresh environment is reset and the recorded actions are replayed
   (:meth:`domains.base.Environment.replay`); the reset's first message must equal the recorded task prompt and
   every replayed observation the recorded one. A prefix that cannot be replayed faithfully is written to
   ``skipped_prefixes.jsonl`` in the continuation run directory, printed, and never continued.
2. **Branches.** Each branch is an ordinary :class:`harness.schema.Episode` with id ``<source_id>@b<k>``,
   ``source_episode_id``, ``branch_index`` and ``prefix_steps = Z``; its first ``Z`` steps are the source steps
   copied verbatim (the source forecasts are never altered) and the conversation is rebuilt from the record by
   :func:`harness.loop.build_messages` (no model call for the prefix). Its step budget is ``Z + K``. Its decoding
   seed is ``derive_seed(run seed, "<source_id>@b<k>")``: deterministic in (run seed, episode, branch).
   Branches are written by the batch runner, so the continuation directory is resumable and crash-safe like
   any run; its manifest's ``RunConfig.continuation`` records the source run directory, the source config hash,
   ``branches``, ``extra_steps`` and the continued prefix ids. The source run directory is only read.
3. **q_Z.** :func:`estimate_qz` aggregates branch outcomes (:mod:`scoring.qz`), fits the cross-fitted plug-in
   model, writes ``qz.jsonl`` (:mod:`scoring.qz_file`, consumed by ``uqh score --censoring exact --q-z``) and the
   Table 7/8-shaped audit with the conditional-projection identity check (``audit.json`` / ``audit.md``).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from harness.errors import UserError
from harness.schema import (
    EPISODES_FILE,
    MANIFEST_FILE,
    Episode,
    Manifest,
    RunConfig,
    StopReason,
    read_manifest,
)

SKIPPED_FILE = "skipped_prefixes.jsonl"
QZ_FILE = "qz.jsonl"
AUDIT_JSON = "audit.json"
AUDIT_MD = "audit.md"
QZ_METHODS = ("hybrid", "mc", "plugin")


# ------------------------------------------------------------------------------------------ source run


def load_source(run_dir: Path) -> tuple[Manifest, list[Episode]]:
    run_dir = Path(run_dir)
    if not (run_dir / MANIFEST_FILE).is_file():
        raise UserError(f"{run_dir} is not a run directory (no {MANIFEST_FILE}); pass the directory `uqh run` wrote")
    try:
        manifest = read_manifest(run_dir)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {run_dir / MANIFEST_FILE}: {str(exc).splitlines()[0]}") from None
    if manifest.config.continuation is not None:
        raise UserError(f"{run_dir} is itself a continuation run; pass the source run directory")
    from harness.store import load_episodes

    return manifest, load_episodes(run_dir)


def _episode_order(config: RunConfig):
    rank = {t: i for i, t in enumerate(config.task_ids)}
    return lambda ep: (rank.get(ep.task_id, len(rank)), ep.task_id, ep.sample_index, ep.episode_id)


def select_prefixes(
    manifest: Manifest, episodes: Sequence[Episode], *, n: int | None = None, ids: Sequence[str] | None = None
) -> list[Episode]:
    """The censored prefixes to continue, in the source run's canonical order (task order, then sample index).

    ``ids``: exactly these episodes (each must exist and have stopped on ``max_steps``); else the first ``n``
    ``max_steps`` episodes (all when ``n`` is None).
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
        return sorted(out, key=_episode_order(manifest.config))
    if n is not None and n < 1:
        raise UserError("--prefixes must be at least 1")
    censored = sorted(
        (ep for ep in episodes if ep.stop_reason == StopReason.max_steps and ep.source_episode_id is None),
        key=_episode_order(manifest.config),
    )
    if not censored:
        raise UserError("the source run has no max_steps episodes; there is nothing to continue")
    return censored if n is None else censored[:n]


def continuation_config(
    source: Manifest,
    source_run_dir: Path,
    prefixes: Sequence[Episode],
    *,
    branches: int,
    extra_steps: int,
    api_base: str | None = None,
) -> RunConfig:
    """The continuation run's config: the source config (same model, prompt, decoding, domain options) with a
    step budget of ``Z + K`` and ``continuation`` recording source run, source config hash, M, K and the prefixes."""
    if branches < 1:
        raise UserError("--branches must be at least 1")
    if extra_steps < 1:
        raise UserError("--extra-steps must be at least 1")
    cfg = source.config
    data = cfg.model_dump()
    data["task_ids"] = list(dict.fromkeys(ep.task_id for ep in prefixes))
    data["step_budget"] = cfg.step_budget + extra_steps
    if api_base is not None:
        data["api_base"] = api_base
    data["continuation"] = {
        "source_run_dir": str(Path(source_run_dir).resolve()),
        "source_config_hash": source.config_hash,
        "branches": branches,
        "extra_steps": extra_steps,
        "prefix_ids": [ep.episode_id for ep in prefixes],
    }
    return RunConfig.model_validate(data)


def branch_seed(run_seed: int, source_episode_id: str, branch_index: int) -> int:
    """Decoding seed of branch k of a prefix: ``derive_seed(run_seed, "<source_id>@b<k>")``."""
    from harness.loop import branch_episode_id, derive_seed

    return derive_seed(run_seed, branch_episode_id(source_episode_id, branch_index))


def branch_specs(config: RunConfig, prefixes: Sequence[Episode], branches: int) -> list:
    """One :class:`harness.loop.EpisodeSpec` per (prefix, branch), prefix steps copied from the source."""
    from harness.loop import EpisodeSpec, branch_episode_id

    specs = []
    for ep in prefixes:
        for k in range(branches):
            specs.append(
                EpisodeSpec(
                    episode_id=branch_episode_id(ep.episode_id, k),
                    task_id=ep.task_id,
                    sample_index=ep.sample_index,
                    seed=branch_seed(config.decoding.seed, ep.episode_id, k),
                    prefix=ep,
                    prefix_steps=len(ep.steps),
                    source_episode_id=ep.episode_id,
                    branch_index=k,
                    step_budget=len(ep.steps) + config.continuation["extra_steps"],
                )
            )
    return specs


# ------------------------------------------------------------------------------------------ replay check


@dataclass
class SkippedPrefix:
    episode_id: str
    reason: str

    def to_json(self) -> str:
        return json.dumps({"episode_id": self.episode_id, "reason": self.reason})


def make_domain(config: RunConfig, *, system_prompt: str | None = None):
    """The domain built exactly as the run of ``config`` built it (``harness.runner.build_domain``: its domain,
    split, domain_options and observation_chars). With ``system_prompt`` (the source manifest's), a domain whose
    prompt text differs (prompt file, data or options changed since) is a UserError: branches must continue the
    conversation the prefixes were recorded in."""
    from harness.runner import build_domain

    domain = build_domain(config)
    if system_prompt is not None and domain.system_prompt() != system_prompt:
        split = f" split {config.split}" if config.split is not None else ""
        raise UserError(
            f"the {config.domain}{split} system prompt rebuilt from the source run's config differs from the one "
            "recorded in its manifest; restore the prompt file / data the source run used"
        )
    return domain


def env_seed_for(config: RunConfig, episode: Episode) -> int:
    """The environment seed the source run used for ``episode`` (its own derived seed)."""
    from harness.loop import derive_seed

    return derive_seed(config.decoding.seed, episode.episode_id)


async def check_replay(domain, config: RunConfig, episode: Episode) -> str | None:
    """Replay ``episode``'s recorded actions into a fresh environment; the mismatch reason, or None if faithful."""
    from domains.base import Environment, ReplayMismatch
    from harness.loop import start_env

    if not type(domain).supports_replay:
        return f"domain {config.domain} does not support replay"
    if len(episode.steps) != config.step_budget:
        return f"prefix has {len(episode.steps)} steps but the source step budget is {config.step_budget}"
    env = domain.make_env(episode.task_id, episode_seed=env_seed_for(config, episode))
    try:
        try:
            task_prompt = await start_env(env, episode)
        except ReplayMismatch as exc:
            return f"replay mismatch: {exc}"
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. a recorded action the environment now rejects
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            return f"replay failed: {type(exc).__name__}: {first}"
        # With the default replay (re-execute and compare) the reset must reproduce the recorded task prompt; a
        # domain that restores state from the record (Tau2, whose opening user turn is sampled) validates the
        # recorded conversation itself, and the runner continues the recorded conversation.
        if task_prompt != episode.task_prompt and type(env).replay is Environment.replay:
            return "replay mismatch: the reset environment's task prompt differs from the recorded one"
        return None
    finally:
        env.close()


async def check_replays(domain, config: RunConfig, prefixes: Sequence[Episode]) -> list[SkippedPrefix]:
    skipped = []
    for ep in prefixes:
        reason = await check_replay(domain, config, ep)
        if reason is not None:
            skipped.append(SkippedPrefix(ep.episode_id, reason))
    return skipped


def read_skipped(cont_dir: Path) -> list[SkippedPrefix]:
    path = Path(cont_dir) / SKIPPED_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            out.append(SkippedPrefix(d["episode_id"], d["reason"]))
    return out


def _write_skipped(cont_dir: Path, skipped: Sequence[SkippedPrefix]) -> None:
    from harness.store import atomic_write_text

    atomic_write_text(Path(cont_dir) / SKIPPED_FILE, "".join(s.to_json() + "\n" for s in skipped))


# ------------------------------------------------------------------------------------------ q_Z estimation


@dataclass
class QzResult:
    """Everything :func:`estimate_qz` computed (arrays indexed like ``prefix_ids``)."""

    prefix_ids: list[str]
    mc: dict[str, Any]  # unresolved policy -> scoring.qz.MCEstimate
    plugin_q: np.ndarray | None
    plugin_note: str | None
    q_hat: np.ndarray
    method: np.ndarray
    records: list[Any]  # scoring.qz_file.QzRecord
    audit: dict[str, Any]
    text: str = ""
    skipped: list[SkippedPrefix] = field(default_factory=list)


def _status_and_outcome(ep: Episode) -> tuple[int, float]:
    from scoring.qz import RESOLVED, STATUS_BY_STOP_REASON

    status = STATUS_BY_STOP_REASON[ep.stop_reason.value]
    if status == RESOLVED and ep.outcome is None:
        raise UserError(f"branch {ep.episode_id} ended clean without an outcome; the continuation run is corrupt")
    return status, (float(ep.outcome) if status == RESOLVED else float("nan"))


def _confidences(steps) -> np.ndarray | None:
    vals = [s.verbal_confidence for s in steps]
    if any(v is None for v in vals):
        return None
    return np.asarray(vals, dtype=float)


def continuation_source(cont_dir: Path) -> Path:
    """The source run directory a continuation run directory continues (UserError if it is not one)."""
    cont_dir = Path(cont_dir)
    if not (cont_dir / MANIFEST_FILE).is_file():
        raise UserError(f"{cont_dir} is not a continuation run directory (no {MANIFEST_FILE})")
    cont = read_manifest(cont_dir).config.continuation
    if not cont:
        raise UserError(f"{cont_dir} is not a continuation run (its manifest has no continuation section)")
    return Path(cont["source_run_dir"])


def estimate_qz(
    cont_dir: Path,
    *,
    min_valid: int = 5,
    method: str = "hybrid",
    rule: str = "log",
    weights: str = "linear-front",
    folds: int = 5,
    n_boot: int = 1000,
    seed: int = 0,
    train_complete: bool = False,
    write: bool = True,
) -> QzResult:
    """q_hat_Z for the source run's censored prefixes from the branches in ``cont_dir``, plus the audit.

    ``method``: ``hybrid`` (MC where a prefix has >= ``min_valid`` resolved non-parse branches, cross-fitted
    plug-in elsewhere), ``mc`` (retained prefixes only) or ``plugin`` (plug-in for every prefix, cross-fitted for
    the MC-labelled ones). Prefixes without an estimate get no record (never imputed). The audit scores the frozen
    source verbal-confidence prefix F_{1:Z} (raw, as recorded; prefixes with a missing confidence are left out of
    the score rows and counted) with ``rule`` and ``weights`` (horizon T = Z, the max-step stop length).

    ``train_complete``: also train the plug-in model on the source run's complete (``clean``) episodes, each
    contributing its prefix before the terminal step (``steps[:-1]``, so the Finish action is not seen) with its
    observed outcome Y as label (weight 1). These rows are training data only; they get no q_Z record.
    """
    from scoring import qz
    from scoring.qz_file import QzRecord, write_qz_file

    if method not in QZ_METHODS:
        raise UserError(f"unknown q_Z method {method!r}; use one of {', '.join(QZ_METHODS)}")
    if min_valid < 1:
        raise UserError("--min-valid must be at least 1")
    cont_dir = Path(cont_dir)
    if not (cont_dir / MANIFEST_FILE).is_file():
        raise UserError(f"{cont_dir} is not a continuation run directory (no {MANIFEST_FILE})")
    cont_manifest = read_manifest(cont_dir)
    cont = cont_manifest.config.continuation
    if not cont:
        raise UserError(f"{cont_dir} is not a continuation run (its manifest has no continuation section)")
    source_dir = Path(cont["source_run_dir"])
    source_manifest, source_episodes = load_source(source_dir)
    if source_manifest.config_hash != cont["source_config_hash"]:
        raise UserError(f"the source run {source_dir} has a different config hash than when it was continued")
    from harness.store import load_episodes

    branches = [ep for ep in load_episodes(cont_dir) if ep.source_episode_id is not None]
    skipped = read_skipped(cont_dir)

    prefixes = sorted(
        (ep for ep in source_episodes if ep.stop_reason == StopReason.max_steps and ep.source_episode_id is None),
        key=_episode_order(source_manifest.config),
    )
    index = {ep.episode_id: i for i, ep in enumerate(prefixes)}
    n = len(prefixes)
    b_idx, b_status, b_outcome, b_eps = [], [], [], []
    join_error = 0.0
    join_mismatch = 0
    for br in branches:
        i = index.get(br.source_episode_id)
        if i is None:
            continue
        src = prefixes[i]
        z = br.prefix_steps
        if (
            z != len(src.steps)
            or br.task_prompt != src.task_prompt
            or [s.action for s in br.steps[:z]] != [s.action for s in src.steps]
        ):
            join_mismatch += 1
            continue
        fb, fs = _confidences(br.steps[:z]), _confidences(src.steps)
        if (fb is None) != (fs is None):
            join_mismatch += 1
            continue
        if fb is not None and fb.size:
            join_error = max(join_error, float(np.max(np.abs(fb - fs))))
        s, y = _status_and_outcome(br)
        b_idx.append(i)
        b_status.append(s)
        b_outcome.append(y)
        b_eps.append(br)
    b_idx_a = np.asarray(b_idx, dtype=np.int64)
    b_status_a = np.asarray(b_status, dtype=np.int64)
    b_outcome_a = np.asarray(b_outcome, dtype=float)
    mc = {
        pol: qz.aggregate_mc(b_idx_a, b_status_a, b_outcome_a, n, min_valid=min_valid, unresolved=pol)
        for pol in qz.UNRESOLVED_POLICIES
    }
    primary = mc["exclude"]

    # ---- plug-in nuisance model (never sees the verbal confidences)
    plugin_q = None
    plugin_note = None
    plugin_n_valid = np.zeros(n, dtype=np.int64)
    if method in ("hybrid", "plugin") and n:
        budget = source_manifest.config.step_budget
        feats = np.stack([qz.prefix_features(ep, budget) for ep in prefixes])
        label = np.where(primary.n_resolved > 0, primary.q_hat, np.nan)
        w = primary.n_resolved.astype(float)
        if train_complete:
            done = [ep for ep in source_episodes
                    if ep.stop_reason == StopReason.clean and ep.source_episode_id is None and ep.n_steps >= 2]
            if done:
                extra = np.stack([
                    qz.prefix_feature_vector([s.action for s in ep.steps[:-1]], [s.observation for s in ep.steps[:-1]],
                                             [s.repair_attempts for s in ep.steps[:-1]], budget)
                    for ep in done
                ])
                feats = np.vstack([feats, extra])
                label = np.r_[label, [float(ep.outcome) for ep in done]]
                w = np.r_[w, np.ones(len(done))]
        try:
            fit = qz.fit_plugin(feats, label, w, folds=folds, seed=seed, feature_names=qz.FEATURE_NAMES)
            plugin_q = fit.q_hat[:n]
            total = w[fit.labelled].sum()
            fold_w = np.bincount(fit.fold[fit.labelled], weights=w[fit.labelled])
            plugin_n_valid = np.where(
                fit.labelled, total - fold_w[np.maximum(fit.fold, 0)], total
            ).astype(np.int64)[:n]
        except ValueError as exc:
            plugin_note = f"plug-in model not fitted: {exc}"

    if method == "mc":
        q_hat = np.where(primary.retained, primary.q_hat, np.nan)
        meth = np.where(primary.retained, "mc", "none")
    elif method == "plugin":
        q_hat = plugin_q if plugin_q is not None else np.full(n, np.nan)
        meth = np.where(np.isfinite(q_hat), "plugin", "none")
    else:
        q_hat, meth = qz.hybrid(primary.q_hat, primary.retained, plugin_q if plugin_q is not None else np.full(n, np.nan))
    records = []
    for i, ep in enumerate(prefixes):
        if meth[i] == "none":
            continue
        nv = int(primary.n_resolved[i]) if meth[i] == "mc" else int(plugin_n_valid[i])
        records.append(QzRecord(episode_id=ep.episode_id, q_hat_z=float(q_hat[i]), n_valid=nv, method=str(meth[i])))

    audit = _audit(
        prefixes, mc, b_idx_a, b_status_a, b_outcome_a, b_eps, rule=rule, weights=weights, n_boot=n_boot, seed=seed
    )
    audit["counts"].update(
        {
            "censored_prefixes_in_source": n,
            "prefixes_with_branches": int(np.sum(np.bincount(b_idx_a, minlength=n) > 0)) if n else 0,
            "branches": len(b_eps),
            "skipped": len(skipped),
            "join_mismatch_branches": join_mismatch,
            "max_abs_branch_vs_source_forecast": join_error,
            "records": len(records),
            "records_mc": int(np.sum(meth == "mc")),
            "records_plugin": int(np.sum(meth == "plugin")),
            "without_estimate": int(np.sum(meth == "none")),
        }
    )
    audit["settings"] = {"source_run_dir": str(source_dir), "min_valid": min_valid, "method": method, "rule": rule, "weights": weights,
                         "predictor": "verbal_confidence (raw)", "n_boot": n_boot, "seed": seed,
                         "plugin_features": list(qz.FEATURE_NAMES), "plugin_note": plugin_note,
                         "plugin_train_complete": train_complete}
    text = _audit_text(audit)
    if write:
        from harness.store import atomic_write_text

        write_qz_file(cont_dir / QZ_FILE, records)
        atomic_write_text(cont_dir / AUDIT_JSON, json.dumps(audit, indent=2) + "\n")
        atomic_write_text(cont_dir / AUDIT_MD, text + "\n")
    return QzResult(
        prefix_ids=[ep.episode_id for ep in prefixes],
        mc=mc,
        plugin_q=plugin_q,
        plugin_note=plugin_note,
        q_hat=q_hat,
        method=meth,
        records=records,
        audit=audit,
        text=text,
        skipped=skipped,
    )


def _audit(prefixes, mc, b_idx, b_status, b_outcome, b_eps, *, rule, weights, n_boot, seed) -> dict:
    """Table 7 / Table 8 numbers, the unresolved sensitivity rows and the conditional-projection identity."""
    from scoring import qz
    from scoring.rules import parse_score
    from scoring.tps import tps, tps_censored_exact, tps_censored_simple
    from scoring.weights import trajectory_weights

    primary = mc["exclude"]
    retained = np.flatnonzero(primary.retained)
    n_ret = retained.size
    counts = {
        "min_valid": primary.min_valid,
        "retained": int(n_ret),
        "mean_valid": float(primary.n_resolved[retained].mean()) if n_ret else None,
        "mean_parse": float(primary.n_parse_error[retained].mean()) if n_ret else None,
        "unresolved": int(primary.n_unresolved.sum()),
        "parse_error_branches": int(primary.n_parse_error.sum()),
        "other_branches": int(primary.n_other.sum()),
    }
    distribution = qz.qz_distribution(primary.q_hat[retained], n_boot=n_boot, seed=seed)
    # score rows: retained prefixes whose every step has a verbal confidence
    conf = {int(i): _confidences(prefixes[i].steps) for i in retained}
    scored = np.array([i for i in retained if conf[int(i)] is not None and conf[int(i)].size], dtype=np.int64)
    counts["scored"] = int(scored.size)
    counts["missing_confidence"] = int(n_ret - scored.size)
    out: dict[str, Any] = {"counts": counts, "distribution": distribution}
    if scored.size == 0:
        out.update({"comparison": None, "sensitivity": {}, "identity_max_error": None})
        return out
    score_rule = parse_score(rule)
    values = np.concatenate([conf[int(i)] for i in scored])
    offsets = np.concatenate([[0], np.cumsum([conf[int(i)].size for i in scored])])
    w = trajectory_weights(offsets, weights)
    y0 = np.zeros(scored.size)
    delta = np.zeros(scored.size, dtype=bool)
    simple = tps_censored_simple(values, offsets, y0, delta, score_rule, w)
    exact = {
        pol: tps_censored_exact(values, offsets, y0, delta, mc[pol].q_hat[scored], score_rule, w)
        for pol in qz.UNRESOLVED_POLICIES
    }
    out["comparison"] = qz.paired_comparison(simple, exact["exclude"], n_boot=n_boot, seed=seed)
    out["sensitivity"] = {}
    for pol, label in (("exclude", "excluded (primary)"), ("failure", "as failures"), ("success", "as successes")):
        cmp = qz.paired_comparison(simple, exact[pol], n_boot=n_boot, seed=seed)
        out["sensitivity"][label] = {"mean_q": float(np.mean(mc[pol].q_hat[scored])), "difference": cmp["difference"]}
    # identity: each valid branch's own copy of the prefix forecasts scored against its outcome (Eq. 2 on Z steps)
    pos = {int(i): k for k, i in enumerate(scored)}
    br_vals, br_len, br_y, br_idx = [], [], [], []
    for j, br in enumerate(b_eps):
        k = pos.get(int(b_idx[j]))
        if k is None or b_status[j] != qz.RESOLVED:
            continue
        f = _confidences(br.steps[: br.prefix_steps])
        br_vals.append(f)
        br_len.append(f.size)
        br_y.append(b_outcome[j])
        br_idx.append(k)
    br_offsets = np.concatenate([[0], np.cumsum(br_len)])
    br_scores = tps(np.concatenate(br_vals), br_offsets, np.asarray(br_y), score_rule, trajectory_weights(br_offsets, weights))
    err, _ = qz.projection_identity_error(exact["exclude"], br_scores, np.asarray(br_idx))
    out["identity_max_error"] = err
    out["per_prefix"] = [
        {"episode_id": prefixes[int(i)].episode_id, "q_hat_mc": float(primary.q_hat[int(i)]),
         "n_valid": int(primary.n_resolved[int(i)]), "simple": float(simple[k]), "exact_mc": float(exact["exclude"][k])}
        for k, i in enumerate(scored)
    ]
    return out


def _audit_text(audit: dict) -> str:
    from scoring import qz

    c = audit["counts"]
    head = qz.format_audit(
        audit["distribution"],
        audit.get("comparison"),
        identity_max_error=audit.get("identity_max_error"),
        sensitivity=audit.get("sensitivity") or None,
        counts={
            "prefixes": c.get("prefixes_with_branches"),
            "retained": c["retained"],
            "min_valid": c["min_valid"],
            "mean_valid": c["mean_valid"],
            "mean_parse": c["mean_parse"],
            "unresolved": c["unresolved"],
            "skipped": c.get("skipped", 0),
        },
    )
    s = audit.get("settings", {})
    tail = [
        "",
        f"Scores: {s.get('rule')} rule, {s.get('weights')} weights, predictor {s.get('predictor')}; "
        f"{c.get('scored')} retained prefixes scored, {c.get('missing_confidence')} left out (missing confidence).",
        f"q_Z file: {c.get('records')} records ({c.get('records_mc')} mc, {c.get('records_plugin')} plug-in); "
        f"{c.get('without_estimate')} censored prefixes without an estimate.",
    ]
    if c.get("join_mismatch_branches"):
        tail.append(f"WARNING: {c['join_mismatch_branches']} branches whose prefix differs from the source were ignored.")
    if s.get("plugin_note"):
        tail.append(s["plugin_note"])
    return head + "\n" + "\n".join(tail)


# ------------------------------------------------------------------------------------------ running branches


@dataclass
class ContinueReport:
    out_dir: Path
    n_prefixes: int
    skipped: list[SkippedPrefix]
    n_branches_planned: int
    n_branches_written: int
    summary: Any = None

    @property
    def n_branches_missing(self) -> int:
        return self.n_branches_planned - self.n_branches_written


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
    concurrency: int | None = None,
    api_base: str | None = None,
    progress: bool = True,
    client_factory=None,
) -> ContinueReport:
    """Replay-check the selected censored prefixes of ``source_dir`` and run ``branches`` continuation branches of
    each faithful one into ``out_dir`` (created, or resumed when it holds the same continuation config).

    ``extra_steps`` defaults to the source step budget. The source directory is only read.
    """
    from harness.runner import run_batch
    from harness.store import RunStore, check_out_dir

    source_dir, out_dir = Path(source_dir), Path(out_dir)
    manifest, episodes = load_source(source_dir)
    if _inside(out_dir, source_dir) or _inside(source_dir, out_dir):
        raise UserError("--out must be a directory outside the source run directory (the source is never modified)")
    prefixes = select_prefixes(manifest, episodes, n=n_prefixes, ids=ids)
    k = manifest.config.step_budget if extra_steps is None else extra_steps
    config = continuation_config(manifest, source_dir, prefixes, branches=branches, extra_steps=k, api_base=api_base)
    check_out_dir(out_dir)
    if (out_dir / MANIFEST_FILE).exists():
        # resume: the store refuses a different config; check now, before any replay work
        RunStore.open_or_create(out_dir, config, system_prompt=read_manifest(out_dir).system_prompt).close()

    domain = make_domain(manifest.config, system_prompt=manifest.system_prompt)  # as the source run built it
    with contextlib.ExitStack() as stack:
        runtime: dict[str, Any] = {"run_dir": out_dir}
        if config.user_model:  # e.g. Tau2: make_env/reset need the user simulator
            from harness.local_model import resolve_model

            user_model, user_base = stack.enter_context(resolve_model(config.user_model, config.user_api_base))
            runtime.update(user_model=user_model, user_api_base=user_base, user_decoding=config.user_decoding)
        domain.prepare_runtime(runtime)
        skipped = asyncio.run(check_replays(domain, manifest.config, prefixes))
    skipped_ids = {s.episode_id for s in skipped}
    keep = [ep for ep in prefixes if ep.episode_id not in skipped_ids]
    specs = branch_specs(config, keep, branches)
    # Create the run directory first so that the skipped prefixes are recorded even if the run is interrupted.
    system_prompt = domain.system_prompt()
    RunStore.open_or_create(out_dir, config, system_prompt=system_prompt, info=domain.manifest_info()).close()
    _write_skipped(out_dir, skipped)
    summary = None
    if specs:
        summary = run_batch(
            config, out_dir, specs=specs, concurrency=concurrency, progress=progress, client_factory=client_factory
        )
    from harness.store import load_episodes

    planned = {s.episode_id for s in specs}
    written = sum(1 for ep in load_episodes(out_dir) if ep.episode_id in planned)
    return ContinueReport(
        out_dir=out_dir,
        n_prefixes=len(prefixes),
        skipped=skipped,
        n_branches_planned=len(specs),
        n_branches_written=written,
        summary=summary,
    )
