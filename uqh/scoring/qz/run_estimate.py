"""q_hat_Z for a source run's censored prefixes from a continuation run, and the continuation audit (Appendix H).

Pure: reads two run directories through :class:`rundir.RunDir` and returns a typed :class:`QzEstimate`; writes
nothing (``uqh.reports.continuation_audit`` renders and writes ``qz.jsonl`` / ``audit.json`` / ``audit.md``).

- **q_Z** (H.1): Monte Carlo over the resolved non-parse branches of each prefix (:func:`uqh.scoring.qz.estimate.aggregate_mc`),
  the cross-fitted plug-in model elsewhere (:func:`uqh.scoring.qz.estimate.fit_plugin`), or their hybrid.
- **Audit** (H.2, Tables 7–8): the q_hat_Z^MC distribution of the retained prefixes, the paired comparison of
  TPS^cen,simple and TPS^cen,exact-MC on the frozen source verbal-confidence prefixes, the unresolved-branch
  sensitivity rows, and the conditional-projection identity check.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from pydantic import BaseModel

from uqh.rundir.errors import UserError
from uqh.rundir.qz_file import QzRecord
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import Episode, SkippedPrefix, StopReason
from uqh.scoring.qz import estimate as qz
from uqh.scoring.qz.estimate import MCEstimate, PairedComparison, QzDistribution

QZ_METHODS = ("hybrid", "mc", "plugin")
SENSITIVITY_LABELS = {"exclude": "excluded (primary)", "failure": "as failures", "success": "as successes"}


class AuditCounts(BaseModel):
    min_valid: int
    retained: int
    mean_valid: float | None = None
    mean_parse: float | None = None
    unresolved: int = 0
    parse_error_branches: int = 0
    other_branches: int = 0
    scored: int = 0
    missing_confidence: int = 0
    censored_prefixes_in_source: int = 0
    prefixes_with_branches: int = 0
    branches: int = 0
    skipped: int = 0
    join_mismatch_branches: int = 0
    max_abs_branch_vs_source_forecast: float = 0.0
    records: int = 0
    records_mc: int = 0
    records_plugin: int = 0
    without_estimate: int = 0


class RunCost(BaseModel):
    """What the continuation branches of a run used (their own calls; the copied prefix steps are not theirs)."""

    stop_rule: str = "fixed"
    max_branches: int = 0  # --branches: M (fixed) or the maximum (sequential)
    prefixes: int = 0  # prefixes with at least one branch
    branches: int = 0
    branches_max: int = 0  # prefixes x max_branches: what the fixed design runs on the same prefixes
    stopped_half_width: int = 0
    stopped_max_branches: int = 0
    open: int = 0
    decision_mismatch: int = 0  # recorded decisions whose counts differ from the branches found
    calls: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    cache_write_prompt_tokens: int = 0
    calls_reporting_cache: int = 0  # calls whose usage said how many prompt tokens were cached
    completion_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0

    @property
    def uncached_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_prompt_tokens


class SensitivityRow(BaseModel):
    mean_q: float
    difference: qz.MeanCI


class PrefixScore(BaseModel):
    episode_id: str
    q_hat_mc: float
    n_valid: int
    simple: float
    exact_mc: float


class AuditSettings(BaseModel):
    source_run_dir: str
    min_valid: int
    method: str
    rule: str
    weights: str
    predictor: str = "verbal_confidence (raw)"
    n_boot: int
    seed: int
    plugin_features: list[str]
    plugin_note: str | None = None
    plugin_train_complete: bool = False


class ContinuationAudit(BaseModel):
    """Table 7 / Table 8 numbers, the unresolved sensitivity rows and the conditional-projection identity."""

    counts: AuditCounts
    distribution: QzDistribution
    comparison: PairedComparison | None = None
    sensitivity: dict[str, SensitivityRow] = {}
    identity_max_error: float | None = None
    per_prefix: list[PrefixScore] = []
    settings: AuditSettings | None = None
    cost: RunCost | None = None


@dataclass
class QzEstimate:
    """Everything :func:`estimate_qz` computed (arrays indexed like ``prefix_ids``)."""

    source_run_dir: str
    prefix_ids: list[str]
    mc: dict[str, MCEstimate]  # unresolved policy -> Monte Carlo aggregation
    plugin_q: np.ndarray | None
    plugin_note: str | None
    q_hat: np.ndarray
    method: np.ndarray
    records: list[QzRecord]
    audit: ContinuationAudit
    skipped: list[SkippedPrefix] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ helpers


def _status_and_outcome(ep: Episode) -> tuple[int, float]:
    status = qz.STATUS_BY_STOP_REASON[ep.stop_reason.value]
    if status == qz.RESOLVED and ep.outcome is None:
        raise UserError(f"branch {ep.episode_id} ended clean without an outcome; the continuation run is corrupt")
    return status, (float(ep.outcome) if status == qz.RESOLVED else float("nan"))


def _confidences(steps) -> np.ndarray | None:
    vals = [s.verbal_confidence for s in steps]
    if any(v is None for v in vals):
        return None
    return np.asarray(vals, dtype=float)


def run_cost(cont: RunDir, branches: Sequence[Episode]) -> RunCost:
    """Branches, model calls, prompt tokens (cached / uncached), completion tokens and cost of ``branches`` (only
    their own calls: steps after ``prefix_steps`` and a failed step), with the stop rule's outcome."""
    info = cont.config.continuation or {}
    m = int(info.get("branches", 0))
    out = RunCost(stop_rule=info.get("stop_rule", "fixed"), max_branches=m, branches=len(branches),
                  prefixes=len({b.source_episode_id for b in branches}))
    out.branches_max = out.prefixes * m
    for br in branches:
        for att in [a for st in br.steps[br.prefix_steps:] for a in st.attempts] + list(br.failed_step or []):
            call, u = att.call, att.call.usage
            out.calls += 1
            out.prompt_tokens += u.prompt_tokens or 0
            out.completion_tokens += u.completion_tokens or 0
            if u.cached_prompt_tokens is not None:
                out.calls_reporting_cache += 1
                out.cached_prompt_tokens += u.cached_prompt_tokens
            out.cache_write_prompt_tokens += u.cache_write_prompt_tokens or 0
            if call.cost_usd is None:
                out.unpriced_calls += 1
            else:
                out.cost_usd += call.cost_usd
    for d in cont.stop_decisions().values():
        if d.stopped_by == "half_width":
            out.stopped_half_width += 1
        elif d.stopped_by == "max_branches":
            out.stopped_max_branches += 1
        else:
            out.open += 1
    return out


def source_of(cont: RunDir) -> RunDir:
    """The source run a continuation run continues (UserError unless ``cont`` is a continuation run whose source
    still has the config it was continued from)."""
    info = cont.config.continuation
    if not info:
        raise UserError(f"{cont.path} is not a continuation run (its manifest has no continuation section)")
    source = RunDir.open(info["source_run_dir"])
    if source.manifest.config_hash != info["source_config_hash"]:
        raise UserError(f"the source run {source.path} has a different config hash than when it was continued")
    return source


# ------------------------------------------------------------------------------------------ estimation


def estimate_qz(
    cont: RunDir,
    *,
    min_valid: int = 5,
    method: str = "hybrid",
    rule: str = "log",
    weights: str = "linear-front",
    folds: int = 5,
    n_boot: int = 1000,
    seed: int = 0,
    train_complete: bool = False,
) -> QzEstimate:
    """q_hat_Z for the source run's censored prefixes from the branches in ``cont``, plus the audit.

    ``method``: ``hybrid`` (MC where a prefix has >= ``min_valid`` resolved non-parse branches, cross-fitted
    plug-in elsewhere), ``mc`` (retained prefixes only) or ``plugin`` (plug-in for every prefix, cross-fitted for
    the MC-labelled ones). Prefixes without an estimate get no record (never imputed). The audit scores the frozen
    source verbal-confidence prefix F_{1:Z} (raw, as recorded; prefixes with a missing confidence are left out of
    the score rows and counted) with ``rule`` and ``weights`` (horizon T = Z, the max-step stop length).

    ``train_complete``: also train the plug-in model on the source run's complete (``clean``) episodes, each
    contributing its prefix before the terminal step (``steps[:-1]``, so the Finish action is not seen) with its
    observed outcome Y as label (weight 1). These rows are training data only; they get no q_Z record.
    """
    if method not in QZ_METHODS:
        raise UserError(f"unknown q_Z method {method!r}; use one of {', '.join(QZ_METHODS)}")
    if min_valid < 1:
        raise UserError("--min-valid must be at least 1")
    source = source_of(cont)
    branches = [ep for ep in cont.episodes() if ep.source_episode_id is not None]
    skipped = cont.skipped_prefixes()

    prefixes = source.censored_episodes()
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
        budget = source.config.step_budget
        feats = np.stack([qz.prefix_features(ep, budget) for ep in prefixes])
        label = np.where(primary.n_resolved > 0, primary.q_hat, np.nan)
        w = primary.n_resolved.astype(float)
        if train_complete:
            done = [ep for ep in source.episodes()
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
    decisions = cont.stop_decisions()  # sequential stop rules only: what the harness decided, never recomputed here
    mismatch = sum(
        1 for eid, d in decisions.items()
        if eid in index and (d.resolved, d.successes) != (int(primary.n_resolved[index[eid]]),
                                                          int(primary.n_success[index[eid]]))
    )
    records = []
    for i, ep in enumerate(prefixes):
        if meth[i] == "none":
            continue
        nv = int(primary.n_resolved[i]) if meth[i] == "mc" else int(plugin_n_valid[i])
        d = decisions.get(ep.episode_id)
        extra = {} if d is None else {
            "branches": d.branches, "stop_rule": d.stop_rule, "interval": d.interval if meth[i] == "mc" else None,
        }
        records.append(QzRecord(episode_id=ep.episode_id, q_hat_z=float(q_hat[i]), n_valid=nv, method=str(meth[i]),
                                **extra))

    audit = continuation_audit(
        prefixes, mc, b_idx_a, b_status_a, b_eps, rule=rule, weights=weights, n_boot=n_boot, seed=seed
    )
    audit.counts = audit.counts.model_copy(update={
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
    })
    audit.cost = run_cost(cont, branches).model_copy(update={"decision_mismatch": mismatch})
    audit.settings = AuditSettings(
        source_run_dir=str(source.path), min_valid=min_valid, method=method, rule=rule, weights=weights,
        n_boot=n_boot, seed=seed, plugin_features=list(qz.FEATURE_NAMES), plugin_note=plugin_note,
        plugin_train_complete=train_complete,
    )
    return QzEstimate(
        source_run_dir=str(source.path),
        prefix_ids=[ep.episode_id for ep in prefixes],
        mc=mc,
        plugin_q=plugin_q,
        plugin_note=plugin_note,
        q_hat=q_hat,
        method=meth,
        records=records,
        audit=audit,
        skipped=skipped,
    )


def continuation_audit(
    prefixes: Sequence[Episode],
    mc: dict[str, MCEstimate],
    b_idx: np.ndarray,
    b_status: np.ndarray,
    b_eps: Sequence[Episode],
    *,
    rule: str,
    weights: str,
    n_boot: int,
    seed: int,
) -> ContinuationAudit:
    """Table 7 / Table 8 numbers, the unresolved sensitivity rows and the conditional-projection identity
    (Appendix H.2) for branches ``b_eps`` of ``prefixes`` (``b_idx[j]``: the prefix of branch j)."""
    from uqh.scoring.rules import parse_score
    from uqh.scoring.tps import tps, tps_censored_exact, tps_censored_simple
    from uqh.scoring.weights import trajectory_weights

    primary = mc["exclude"]
    retained = np.flatnonzero(primary.retained)
    n_ret = retained.size
    counts: dict[str, Any] = {
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
    if scored.size == 0:
        return ContinuationAudit(counts=AuditCounts(**counts), distribution=distribution)
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
    comparison = qz.paired_comparison(simple, exact["exclude"], n_boot=n_boot, seed=seed)
    sensitivity = {}
    for pol, label in SENSITIVITY_LABELS.items():
        cmp = qz.paired_comparison(simple, exact[pol], n_boot=n_boot, seed=seed)
        sensitivity[label] = SensitivityRow(mean_q=float(np.mean(mc[pol].q_hat[scored])), difference=cmp.difference)
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
        br_y.append(float(br.outcome))
        br_idx.append(k)
    identity = None
    if br_vals:
        br_offsets = np.concatenate([[0], np.cumsum(br_len)])
        br_scores = tps(np.concatenate(br_vals), br_offsets, np.asarray(br_y), score_rule,
                        trajectory_weights(br_offsets, weights))
        identity, _ = qz.projection_identity_error(exact["exclude"], br_scores, np.asarray(br_idx))
    per_prefix = [
        PrefixScore(episode_id=prefixes[int(i)].episode_id, q_hat_mc=float(primary.q_hat[int(i)]),
                    n_valid=int(primary.n_resolved[int(i)]), simple=float(simple[k]), exact_mc=float(exact["exclude"][k]))
        for k, i in enumerate(scored)
    ]
    return ContinuationAudit(
        counts=AuditCounts(**counts), distribution=distribution, comparison=comparison, sensitivity=sensitivity,
        identity_max_error=identity, per_prefix=per_prefix,
    )
