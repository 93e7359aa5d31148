"""Exact vs simple censored score over the retained continuation prefixes (Appendix H.2, Tables 7–9).

The population is the paper's: the censored prefixes a continuation run sampled, of which those with at least
``min_valid`` resolved non-parse branches are *retained*; every quantity is computed over the retained prefixes
and the counts of the others are stated (:class:`PrefixCounts`). Per predictor row (raw and cross-fitted Platt of
every registered predictor, the base rate) and weight schedule:

- :func:`prefix_scores` -- per prefix TPS^cen,simple (Eq. 5) and TPS^cen,exact-MC (Eq. 4 with q̂_Z^MC);
- :func:`branch_average_scores` -- per prefix the branch-average complete-prefix score, the right-hand side of the
  conditional-projection identity (H.2);
- :func:`score_prefix_stream` -- Table 8/9 numbers of one stream: means with paired-bootstrap CIs and SE, Δ/SE,
  the identity error, Eq. (17)'s closed form check (log score) and the unresolved-branch sensitivity;
- :func:`plugin_bias` -- Remarks C.4/C.5: the conditional-mean bias of the plug-in q̂_Z on the retained prefixes
  (cross-fitted plug-in vs MC) and what it moves the exact score by;
- :func:`censored_prefix_audit` -- all of it for one source run and its continuation.

The Platt stream of a prefix is the run's cross-fitted Platt stream on the simple censored-extension sample (ΔY
labels over the working sample, the schedule's own weights) -- the stream the sensitivity table scores -- so the
simple and exact columns score the same frozen forecasts and differ only by q̂_Z.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel

from uqh.scoring.pipeline import ScoreOptions, platt_stream
from uqh.scoring.qz.run_estimate import estimate_qz
from uqh.scoring.qz.estimate import QzDistribution, projection_identity_error, qz_distribution
from uqh.scoring.registry import BASE_RATE, get_predictor
from uqh.scoring.rules import ScoreRule, parse_score
from uqh.scoring.streams import RunData, build_sample
from uqh.scoring.tps import branch_scores, exact_minus_simple_log, tps_censored_exact, tps_censored_simple
from uqh.scoring.weights import trajectory_weights

#: the paper's primary row of Table 8
PRIMARY = ("verbal", "platt", "linear-front")
#: Table 9's schedules: the paper prints linear-front and uniform; exponential-front is added (issue 29)
PREFIX_SCHEDULES = ("linear-front", "uniform", "exponential-front")


class PrefixCounts(BaseModel):
    """Which censored prefixes the audit is over: sampled → continued → retained (the rest stated, not scored)."""

    censored_in_source: int
    sampled: int  # prefixes the continuation run selected (its manifest's prefix_ids)
    skipped: int  # not replayable, never continued
    continued: int  # with at least one branch
    retained: int  # >= min_valid resolved non-parse branches: the population of every table
    min_valid: int
    selection: dict[str, Any] | None = None  # the manifest's random-sample record (uqh continue --sample)
    branches_written: int = 0  # branches in the continuation run
    #: branches the continuation was asked for: replayable sampled prefixes x --branches (the maximum under a
    #: sequential stop rule); more than written = a partial continuation (stopped, or still running)
    branches_planned: int = 0
    stop_rule: str = "fixed"

    @property
    def partial(self) -> bool:
        """Fewer branches written than the fixed design asked for (a sequential rule may stop a prefix early)."""
        return self.stop_rule == "fixed" and self.branches_written < self.branches_planned


class MeanSE(BaseModel):
    """A mean over prefixes with its percentile-bootstrap CI and bootstrap SE (None when nothing to average)."""

    mean: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    se: float | None = None


class PrefixScoreRow(BaseModel):
    """Table 8/9: one stream's exact-MC vs simple censored score over the retained prefixes."""

    predictor: str
    calibration: str
    weights: str
    score: str
    n: int  # retained prefixes scored
    n_missing: int  # retained prefixes without every value of this stream (left out, counted)
    simple: MeanSE
    exact: MeanSE
    difference: MeanSE  # exact − simple, paired
    delta_over_se: float | None = None
    identity_max_error: float | None = None  # max_i |TPS_i^cen,exact-MC − branch-average TPS_i|
    eq17_max_error: float | None = None  # log score: max_i |Δ_i − q̂_Z Σ w log(F/(1−F))|
    unresolved_as_failure: MeanSE = MeanSE()  # exact − simple with unresolved branches counted as Y = 0
    unresolved_as_success: MeanSE = MeanSE()  # ... as Y = 1
    note: str | None = None


class PluginBias(BaseModel):
    """Remarks C.4/C.5 on the retained prefixes: r = q̂_plugin − q̂_MC (cross-fitted plug-in, out of fold)."""

    n: int
    mean_bias: MeanSE  # mean r: the plug-in surrogate's conditional-mean bias, estimated at the prefix level
    mean_abs_bias: float | None = None
    primary_score_shift: MeanSE = MeanSE()  # primary stream: TPS^cen,exact(q̂_plugin) − TPS^cen,exact(q̂_MC)
    note: str | None = None


class CensoredPrefixAudit(BaseModel):
    """The "Censored prefixes: exact vs simple" section of one source run and its continuation."""

    continuation_dir: str
    counts: PrefixCounts
    distribution: QzDistribution  # Table 7, over the retained prefixes
    rows: list[PrefixScoreRow] = []
    plugin_bias: PluginBias | None = None


@dataclass
class RetainedPrefixes:
    """The retained prefixes of a continuation (arrays aligned with ``episode_ids``)."""

    episode_ids: np.ndarray  # str
    q_hat: dict[str, np.ndarray]  # unresolved policy (exclude / failure / success) -> q̂_Z^MC
    n_success: np.ndarray  # resolved branches with Y = 1
    n_resolved: np.ndarray  # resolved non-parse branches
    q_plugin: np.ndarray | None = None  # cross-fitted plug-in q̂_Z (NaN where not fitted); None: no plug-in
    plugin_note: str | None = None


def prefix_scores(values, offsets, weights, q_hat, rule: ScoreRule) -> tuple[np.ndarray, np.ndarray]:
    """Per censored prefix: TPS^cen,simple (Eq. 5, q_Z ≈ 0) and TPS^cen,exact (Eq. 4 with ``q_hat``)."""
    n = len(offsets) - 1
    y0, delta = np.zeros(n), np.zeros(n, dtype=bool)
    return (tps_censored_simple(values, offsets, y0, delta, rule, weights),
            tps_censored_exact(values, offsets, y0, delta, np.asarray(q_hat, dtype=float), rule, weights))


def branch_average_scores(values, offsets, weights, n_success, n_resolved, rule: ScoreRule,
                          exact: np.ndarray) -> float | None:
    """The conditional-projection identity of H.2: max_i |TPS_i^cen,exact-MC − (1/M_i) Σ_m TPS(F_{i,1:Z}, Y_i^(m))|,
    the right-hand side evaluated branch by branch (each resolved branch's outcome against the frozen prefix
    forecasts), not through q̂. None when no prefix has a resolved branch."""
    s1, s0 = branch_scores(values, offsets, weights, rule)
    n_success, n_resolved = np.asarray(n_success, np.int64), np.asarray(n_resolved, np.int64)
    prefix = np.arange(len(n_success))
    branch_prefix = np.concatenate([np.repeat(prefix, n_success), np.repeat(prefix, n_resolved - n_success)])
    branch_y = np.concatenate([np.ones(n_success.sum()), np.zeros((n_resolved - n_success).sum())])
    if branch_prefix.size == 0:
        return None
    per_branch = np.where(branch_y == 1.0, s1[branch_prefix], s0[branch_prefix])
    error, _ = projection_identity_error(exact, per_branch, branch_prefix)
    return error if np.isfinite(error) else None


def mean_se(x: np.ndarray, resamples: np.ndarray, alpha: float = 0.05) -> MeanSE:
    """Mean of ``x`` with the percentile CI and SD of its means over ``resamples`` (a (B, n) index matrix)."""
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return MeanSE()
    if resamples.size == 0:
        return MeanSE(mean=float(x.mean()))
    means = x[resamples].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return MeanSE(mean=float(x.mean()), ci_low=float(lo), ci_high=float(hi), se=float(means.std(ddof=1))
                  if means.size > 1 else None)


def score_prefix_stream(values, offsets, weights, prefixes: RetainedPrefixes, rule: ScoreRule,
                        n_boot: int, seed: int) -> dict[str, Any]:
    """Table 8/9 fields of one stream on ``prefixes`` (aligned with ``offsets``): simple, exact-MC and their paired
    difference (one set of prefix-level resamples for all, ``n_boot`` of them), Δ/SE, the identity error, Eq. (17)'s
    check for the log score, and the difference with unresolved branches as failures / successes."""
    n = len(offsets) - 1
    resamples = np.random.default_rng(seed).integers(0, n, size=(n_boot, n)) if n and n_boot else np.zeros((0, n), int)
    simple, exact = prefix_scores(values, offsets, weights, prefixes.q_hat["exclude"], rule)
    diff = mean_se(exact - simple, resamples)
    out: dict[str, Any] = {
        "n": n, "simple": mean_se(simple, resamples), "exact": mean_se(exact, resamples), "difference": diff,
        "delta_over_se": diff.mean / diff.se if (diff.mean is not None and diff.se) else None,
        "identity_max_error": branch_average_scores(values, offsets, weights, prefixes.n_success,
                                                    prefixes.n_resolved, rule, exact),
    }
    if rule.name == "log" and n:
        closed = exact_minus_simple_log(values, offsets, weights, prefixes.q_hat["exclude"])
        out["eq17_max_error"] = float(np.max(np.abs((exact - simple) - closed)))
    for policy, key in (("failure", "unresolved_as_failure"), ("success", "unresolved_as_success")):
        _, exact_p = prefix_scores(values, offsets, weights, prefixes.q_hat[policy], rule)
        out[key] = mean_se(exact_p - simple, resamples)
    return out


def plugin_bias(prefixes: RetainedPrefixes, values, offsets, weights, rule: ScoreRule, n_boot: int,
                seed: int) -> PluginBias | None:
    """Remarks C.4/C.5, estimated where both estimates exist (the retained prefixes, plug-in out of fold):
    r_i = q̂_plugin,i − q̂_MC,i (C.5's conditional-mean bias r_t, at the prefix level, with q̂_MC as the unbiased
    reference), its mean with CI and mean |r|, and the shift it causes in the exact score of the stream given,
    TPS^cen,exact(q̂_plugin) − TPS^cen,exact(q̂_MC) = r_i Σ_t w_t D(F_t) (Eq. 4 is linear in q̂; D = S(·,1) − S(·,0)).
    None when the continuation has no plug-in."""
    if prefixes.q_plugin is None:
        return None
    ok = np.isfinite(prefixes.q_plugin)
    if not ok.any():
        return PluginBias(n=0, mean_bias=MeanSE(), note=prefixes.plugin_note or "plug-in q_Z not fitted")
    r = prefixes.q_plugin[ok] - prefixes.q_hat["exclude"][ok]
    resamples = np.random.default_rng(seed).integers(0, r.size, size=(n_boot, r.size))
    out = PluginBias(n=int(r.size), mean_bias=mean_se(r, resamples), mean_abs_bias=float(np.mean(np.abs(r))),
                     note=prefixes.plugin_note)
    if values is not None:
        s1, s0 = branch_scores(values, offsets, weights, rule)
        out.primary_score_shift = mean_se(r * (s1 - s0)[ok], resamples)
    return out


def _streams(run: RunData, predictor: str, scheme: str):
    """(calibration, sample, values, note) of one predictor: raw, and Platt when the predictor is calibratable."""
    sample = build_sample(run, predictor, censoring="simple")
    yield "raw", sample, sample.values, None
    if get_predictor(predictor).calibratable:
        values, note = platt_stream(sample, ScoreOptions(weights=scheme, censoring="simple"))
        yield "platt", sample, values, note


def censored_prefix_audit(run: RunData, prefixes: RetainedPrefixes, counts: PrefixCounts, continuation_dir: str, *,
                          predictors: list[str], schedules=PREFIX_SCHEDULES, score: str = "log", n_boot: int = 1000,
                          seed: int = 0) -> CensoredPrefixAudit:
    """Tables 7–9, the unresolved-branch sensitivity and the plug-in bias of one run's retained prefixes: every
    stream of ``predictors`` (raw / Platt; constants raw) under each weight schedule, primary row first."""
    rule = parse_score(score)
    rows, primary_stream = [], None
    for scheme in schedules:
        for predictor in predictors:
            for cal, sample, values, note in _streams(run, predictor, scheme):
                pos = {str(e): i for i, e in enumerate(sample.episode_ids)}
                keep = np.array([str(e) in pos for e in prefixes.episode_ids], dtype=bool)
                idx = np.array([pos[str(e)] for e in prefixes.episode_ids[keep]], dtype=np.int64)
                row = dict(predictor=predictor, calibration=cal, weights=scheme, score=rule.name,
                           n_missing=int((~keep).sum()), note=note)
                if values is None or idx.size == 0:
                    rows.append(PrefixScoreRow(n=0, simple=MeanSE(), exact=MeanSE(), difference=MeanSE(), **row))
                    continue
                w = trajectory_weights(sample.offsets, scheme, sample.horizon)
                lengths = np.diff(sample.offsets)[idx]
                steps = np.concatenate([np.arange(sample.offsets[i], sample.offsets[i + 1]) for i in idx])
                offs = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
                kept = _subset(prefixes, keep)
                rows.append(PrefixScoreRow(**row, **score_prefix_stream(values[steps], offs, w[steps], kept, rule,
                                                                        n_boot, seed)))
                if (predictor, cal, scheme) == PRIMARY:
                    primary_stream = (kept, values[steps], offs, w[steps])
    rows.sort(key=lambda r: ((r.predictor, r.calibration, r.weights) != PRIMARY, r.calibration != "platt",
                             schedules.index(r.weights), r.predictor == BASE_RATE))
    bias = None
    if primary_stream is not None:
        kept, v, o, w = primary_stream
        bias = plugin_bias(kept, v, o, w, rule, n_boot, seed)
    elif prefixes.q_plugin is not None:
        bias = plugin_bias(prefixes, None, None, None, rule, n_boot, seed)
    return CensoredPrefixAudit(continuation_dir=continuation_dir, counts=counts, rows=rows, plugin_bias=bias,
                               distribution=qz_distribution(prefixes.q_hat["exclude"], n_boot=n_boot, seed=seed))


def _subset(p: RetainedPrefixes, keep: np.ndarray) -> RetainedPrefixes:
    return RetainedPrefixes(p.episode_ids[keep], {k: v[keep] for k, v in p.q_hat.items()}, p.n_success[keep],
                            p.n_resolved[keep], None if p.q_plugin is None else p.q_plugin[keep], p.plugin_note)



def retained_prefixes(cont, *, min_valid: int = 5, seed: int = 0) -> tuple[RetainedPrefixes, PrefixCounts, str]:
    """The retained prefixes of the continuation run ``cont`` (a :class:`rundir.RunDir`), their counts and the
    source run directory: q̂_Z^MC under the three unresolved-branch policies and the cross-fitted plug-in q̂_Z
    (:func:`uqh.scoring.qz.run_estimate.estimate_qz`, hybrid route)."""
    est = estimate_qz(cont, min_valid=min_valid, method="hybrid", n_boot=1, seed=seed)
    primary = est.mc["exclude"]
    keep = primary.retained
    info = cont.config.continuation or {}
    c = est.audit.counts
    counts = PrefixCounts(censored_in_source=c.censored_prefixes_in_source, sampled=len(info.get("prefix_ids", [])),
                          skipped=c.skipped, continued=c.prefixes_with_branches, retained=int(keep.sum()),
                          min_valid=min_valid, selection=info.get("selection"), branches_written=c.branches,
                          branches_planned=(len(info.get("prefix_ids", [])) - c.skipped) * int(info.get("branches", 0)),
                          stop_rule=str(info.get("stop_rule", "fixed")))
    prefixes = RetainedPrefixes(
        episode_ids=np.asarray(est.prefix_ids, dtype=object)[keep],
        q_hat={pol: est.mc[pol].q_hat[keep] for pol in est.mc},
        n_success=primary.n_success[keep], n_resolved=primary.n_resolved[keep],
        q_plugin=None if est.plugin_q is None else np.asarray(est.plugin_q, dtype=float)[keep],
        plugin_note=est.plugin_note,
    )
    return prefixes, counts, est.source_run_dir
