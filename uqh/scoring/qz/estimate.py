"""Estimators of the continuation-success weight q_Z = P(Y=1 | H_Z) for administratively censored prefixes.

Paper: Appendix H (H.1 operational strategies, H.2 Monte Carlo audit, Tables 7-8) and Appendix C
(Proposition C.2, Remark C.4). Pure numpy on flat arrays; the only run-directory knowledge used is
:mod:`uqh.rundir.schema` (for :func:`prefix_features`). Estimation from run directories: :mod:`uqh.scoring.qz.run_estimate`.

Three routes, one output shape (per prefix: ``q_hat_z``, ``n_valid``, ``method``):

- **Monte Carlo** (:func:`aggregate_mc`): ``q_hat^MC = mean of the resolved, non-parse-error branch outcomes``
  (H.1). Unresolved (budget-hit) branches, parse-error branches and other non-clean endings are counted
  separately. Sensitivity variants treat unresolved branches as failures or as successes (H.2, last paragraph).
  Prefixes with fewer than ``min_valid`` resolved non-parse branches are not retained.
- **Plug-in** (:func:`fit_plugin`): a cross-fitted, L2-regularised logistic regression
  ``g(H_Z, Z, metadata)`` on prefix features (:data:`FEATURE_NAMES`) that deliberately exclude every
  uncertainty predictor (verbal confidence, explanations, token log-probabilities), trained on prefixes
  whose continuation outcomes are known (the MC-labelled prefixes, each weighted by its number of valid
  branches, soft label = q_hat^MC).
- **Hybrid** (:func:`hybrid`): MC where the prefix is retained, plug-in elsewhere.

Audit (:func:`qz_distribution`, :func:`paired_comparison`, :func:`projection_identity_error`): the Table 7 /
Table 8 shapes and the conditional-projection identity
``TPS^{cen,exact-MC}_i = (1/M_i) sum_m TPS^{obs}(F_{i,1:Z_i}, Y_i^(m))`` (H.2).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from pydantic import BaseModel

# Branch status codes (from the branch episode's stop_reason).
RESOLVED = 0  # clean: outcome observed
UNRESOLVED = 1  # max_steps: extra-step budget spent without an outcome
PARSE_ERROR = 2  # repairs exhausted: informative failure, excluded (Appendix G)
OTHER = 3  # tool_error / env_terminated (Tau2): no clean label, excluded

STATUS_BY_STOP_REASON = {
    "clean": RESOLVED,
    "max_steps": UNRESOLVED,
    "parse_error": PARSE_ERROR,
    "tool_error": OTHER,
    "env_terminated": OTHER,
}

UNRESOLVED_POLICIES = ("exclude", "failure", "success")


# ------------------------------------------------------------------------------------------ Monte Carlo


@dataclass
class MCEstimate:
    """Per-prefix Monte Carlo aggregation (arrays of length n_prefixes)."""

    q_hat: np.ndarray  # float; NaN where no branch counts for the chosen policy
    n_valid: np.ndarray  # branches entering the mean under the chosen policy
    n_resolved: np.ndarray  # clean branches (the paper's "valid resolved non-parse" count)
    n_success: np.ndarray  # clean branches with Y = 1
    n_unresolved: np.ndarray
    n_parse_error: np.ndarray
    n_other: np.ndarray
    retained: np.ndarray  # bool: n_resolved >= min_valid
    policy: str = "exclude"
    min_valid: int = 5


def aggregate_mc(
    prefix_index: np.ndarray,
    status: np.ndarray,
    outcome: np.ndarray,
    n_prefixes: int,
    *,
    min_valid: int = 5,
    unresolved: str = "exclude",
) -> MCEstimate:
    """Monte Carlo continuation estimate ``q_hat^MC_Z = (1/M) sum_m Y^(m)`` (Appendix H.1).

    ``prefix_index[j]`` is the prefix branch j continues, ``status[j]`` one of RESOLVED / UNRESOLVED /
    PARSE_ERROR / OTHER, ``outcome[j]`` its Y in {0, 1} (ignored unless RESOLVED; NaN allowed).

    ``unresolved``: ``"exclude"`` (primary: mean over resolved branches), ``"failure"`` (unresolved count
    as Y=0) or ``"success"`` (as Y=1). Parse-error and other branches never enter the mean. Retention
    (``n_resolved >= min_valid``) is defined by the resolved count under every policy, so the sensitivity
    variants are computed on the same prefixes.
    """
    if unresolved not in UNRESOLVED_POLICIES:
        raise ValueError(f"unresolved must be one of {UNRESOLVED_POLICIES}, got {unresolved!r}")
    prefix_index = np.asarray(prefix_index, dtype=np.int64)
    status = np.asarray(status, dtype=np.int64)
    outcome = np.asarray(outcome, dtype=float)
    if not (prefix_index.shape == status.shape == outcome.shape):
        raise ValueError("prefix_index, status and outcome must have the same shape")
    if prefix_index.size and (prefix_index.min() < 0 or prefix_index.max() >= n_prefixes):
        raise ValueError("prefix_index out of range")
    resolved = status == RESOLVED
    if np.any(resolved & ~np.isin(outcome, (0.0, 1.0))):
        raise ValueError("a resolved branch needs an outcome in {0, 1}")

    def count(mask: np.ndarray) -> np.ndarray:
        return np.bincount(prefix_index[mask], minlength=n_prefixes).astype(np.int64)

    n_resolved = count(resolved)
    n_success = count(resolved & (outcome == 1.0))
    n_unresolved = count(status == UNRESOLVED)
    n_parse = count(status == PARSE_ERROR)
    n_other = count(status == OTHER)
    if unresolved == "exclude":
        num, den = n_success, n_resolved
    elif unresolved == "failure":
        num, den = n_success, n_resolved + n_unresolved
    else:
        num, den = n_success + n_unresolved, n_resolved + n_unresolved
    with np.errstate(invalid="ignore", divide="ignore"):
        q_hat = np.where(den > 0, num / np.maximum(den, 1), np.nan)
    return MCEstimate(
        q_hat=q_hat,
        n_valid=den,
        n_resolved=n_resolved,
        n_success=n_success,
        n_unresolved=n_unresolved,
        n_parse_error=n_parse,
        n_other=n_other,
        retained=n_resolved >= min_valid,
        policy=unresolved,
        min_valid=min_valid,
    )


# ------------------------------------------------------------------------------------------ plug-in features

#: Prefix features of the plug-in nuisance model g(H_Z, Z, metadata). None of them reads the uncertainty
#: predictors under evaluation (verbal confidence, explanation, token log-probabilities, think text).
FEATURE_NAMES: tuple[str, ...] = (
    "z_over_budget",  # Z / step budget of the source run
    "log1p_z",  # log(1 + Z)
    "repair_rate",  # total repair attempts in the prefix / Z
    "distinct_action_rate",  # number of distinct action strings / Z
    "repeated_action_rate",  # fraction of steps whose action string already occurred earlier
    "last_action_repeated",  # 1 if the last action equals an earlier action
    "no_result_rate",  # fraction of observations matching NO_RESULT_PATTERN
    "distinct_verb_rate",  # distinct action verbs (text before the first '[', '(' or space) / Z
    "log_mean_observation_chars",  # log(1 + mean observation length in characters)
)

#: Observation text that signals an empty or failed tool result (case-insensitive).
NO_RESULT_PATTERN = re.compile(
    r"no result|not found|could not find|did not find|no match|nothing|invalid|error|unknown|does not exist|"
    r"no such|similar:|try something",
    re.IGNORECASE,
)

_VERB = re.compile(r"^\s*([A-Za-z_][\w\-]*)")


def prefix_feature_vector(
    actions: Sequence[str],
    observations: Sequence[str],
    repair_attempts: Sequence[int],
    step_budget: int,
) -> np.ndarray:
    """Numeric features (in :data:`FEATURE_NAMES` order) of one stopped prefix H_Z."""
    z = len(actions)
    if z == 0:
        return np.zeros(len(FEATURE_NAMES))
    norm = [a.strip() for a in actions]
    seen: set[str] = set()
    repeated = 0
    for a in norm:
        repeated += a in seen
        seen.add(a)
    verbs = {(m.group(1).lower() if (m := _VERB.match(a)) else a[:1]) for a in norm}
    no_result = sum(bool(NO_RESULT_PATTERN.search(o or "")) for o in observations)
    return np.array(
        [
            z / max(step_budget, 1),
            np.log1p(z),
            float(sum(repair_attempts)) / z,
            len(seen) / z,
            repeated / z,
            float(norm[-1] in norm[:-1]),
            no_result / z,
            len(verbs) / z,
            np.log1p(np.mean([len(o or "") for o in observations])),
        ]
    )


def prefix_features(episode, step_budget: int | None = None) -> np.ndarray:
    """:func:`prefix_feature_vector` of a :class:`uqh.rundir.schema.Episode` (its recorded steps are H_Z)."""
    steps = episode.steps
    return prefix_feature_vector(
        [s.action for s in steps],
        [s.observation for s in steps],
        [s.repair_attempts for s in steps],
        step_budget if step_budget is not None else episode.step_budget,
    )


# ------------------------------------------------------------------------------------------ logistic regression


@dataclass
class LogisticModel:
    """L2-regularised logistic regression on standardised features (fit by Newton's method)."""

    coef: np.ndarray
    intercept: float
    mean: np.ndarray
    scale: np.ndarray

    def predict(self, x: np.ndarray) -> np.ndarray:
        xs = (np.asarray(x, dtype=float) - self.mean) / self.scale
        return _sigmoid(xs @ self.coef + self.intercept)


def _sigmoid(u: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * u))


def fit_logistic(
    x: np.ndarray,
    y: np.ndarray,
    weight: np.ndarray | None = None,
    *,
    l2: float = 1.0,
    l2_intercept: float = 1e-3,
    max_iter: int = 100,
    tol: float = 1e-10,
) -> LogisticModel:
    """Maximise ``sum_i w_i [y_i log p_i + (1-y_i) log(1-p_i)] - l2/2 |beta|^2 - l2_intercept/2 b^2``.

    ``y`` may be soft (in [0, 1]): a prefix with ``n`` valid branches and ``q_hat^MC = k/n`` contributes
    exactly the same log-likelihood as its ``n`` Bernoulli branch outcomes when ``w = n``. The small intercept
    penalty keeps the fit finite when every label is 0 (or 1).
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n, d = x.shape
    w = np.ones(n) if weight is None else np.asarray(weight, dtype=float)
    mean = x.mean(axis=0) if n else np.zeros(d)
    scale = x.std(axis=0) if n else np.ones(d)
    scale = np.where(scale > 1e-12, scale, 1.0)
    xs = np.hstack([np.ones((n, 1)), (x - mean) / scale])
    penalty = np.r_[l2_intercept, np.full(d, l2)]
    beta = np.zeros(d + 1)
    for _ in range(max_iter):
        p = _sigmoid(xs @ beta)
        grad = xs.T @ (w * (y - p)) - penalty * beta
        hess = (xs * (w * p * (1 - p))[:, None]).T @ xs + np.diag(penalty)
        step = np.linalg.solve(hess, grad)
        beta = beta + step
        if np.max(np.abs(step)) < tol:
            break
    return LogisticModel(coef=beta[1:], intercept=float(beta[0]), mean=mean, scale=scale)


@dataclass
class PluginFit:
    q_hat: np.ndarray  # prediction for every row (cross-fitted on labelled rows)
    labelled: np.ndarray  # bool
    fold: np.ndarray  # fold of each labelled row, -1 for unlabelled rows
    full_model: LogisticModel  # fitted on all labelled rows (used for unlabelled rows)
    feature_names: list[str] = field(default_factory=list)


def fit_plugin(
    features: np.ndarray,
    label: np.ndarray,
    weight: np.ndarray,
    *,
    folds: int = 5,
    l2: float = 1.0,
    seed: int = 0,
    feature_names: Sequence[str] | None = None,
) -> PluginFit:
    """Cross-fitted plug-in nuisance model ``q_hat^plug_Z = g(H_Z, Z, metadata)`` (Appendix H.1).

    Rows with a finite ``label`` and ``weight > 0`` are the training prefixes (known continuation outcomes).
    Each labelled row is predicted by the model fitted on the other folds (cross-fitting, so no prefix is
    scored with a nuisance model that saw its own label); unlabelled rows by the model fitted on all labelled
    rows. Needs at least two labelled rows.
    """
    features = np.asarray(features, dtype=float)
    label = np.asarray(label, dtype=float)
    weight = np.asarray(weight, dtype=float)
    labelled = np.isfinite(label) & (weight > 0)
    idx = np.flatnonzero(labelled)
    if idx.size < 2:
        raise ValueError(f"the plug-in model needs at least 2 prefixes with known continuation outcomes, got {idx.size}")
    k = int(min(max(folds, 2), idx.size))
    rng = np.random.default_rng(seed)
    fold_of = np.full(len(label), -1, dtype=np.int64)
    fold_of[idx[rng.permutation(idx.size)]] = np.arange(idx.size) % k
    q_hat = np.full(len(label), np.nan)
    for f in range(k):
        test = fold_of == f
        train = labelled & ~test
        model = fit_logistic(features[train], label[train], weight[train], l2=l2)
        q_hat[test] = model.predict(features[test])
    full = fit_logistic(features[labelled], label[labelled], weight[labelled], l2=l2)
    if (~labelled).any():
        q_hat[~labelled] = full.predict(features[~labelled])
    return PluginFit(
        q_hat=q_hat,
        labelled=labelled,
        fold=fold_of,
        full_model=full,
        feature_names=list(feature_names or []),
    )


def hybrid(mc_q: np.ndarray, mc_retained: np.ndarray, plugin_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hybrid route (Appendix H.1): MC where the prefix is retained, plug-in elsewhere.

    Returns ``(q_hat, method)`` with method ``"mc"``, ``"plugin"`` or ``"none"`` (no estimate: q_hat NaN).
    """
    mc_q = np.asarray(mc_q, dtype=float)
    plugin_q = np.asarray(plugin_q, dtype=float)
    use_mc = np.asarray(mc_retained, dtype=bool) & np.isfinite(mc_q)
    use_plug = ~use_mc & np.isfinite(plugin_q)
    q = np.where(use_mc, mc_q, np.where(use_plug, plugin_q, np.nan))
    method = np.where(use_mc, "mc", np.where(use_plug, "plugin", "none"))
    return q, method


# ------------------------------------------------------------------------------------------ audit


def _bootstrap_means(values: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Means of ``n_boot`` prefix-level resamples of each column of ``values`` (shape (n,) or (n, c))."""
    rng = np.random.default_rng(seed)
    n = values.shape[0]
    idx = rng.integers(0, n, size=(n_boot, n))
    return values[idx].mean(axis=1)


class MeanCI(BaseModel):
    """A mean with its percentile-bootstrap interval (None where there is nothing to average)."""

    mean: float | None = None
    ci: tuple[float | None, float | None] = (None, None)


class QzDistribution(BaseModel):
    """Table 7: the distribution of q_hat_Z^MC over the retained prefixes."""

    n: int
    mean: float | None = None
    ci: tuple[float | None, float | None] = (None, None)
    median: float | None = None
    frac_zero: float | None = None
    frac_above_half: float | None = None


class PairedComparison(BaseModel):
    """Table 8: mean simple and exact-MC censored TPS and their paired difference."""

    n: int
    simple: MeanCI = MeanCI()
    exact: MeanCI = MeanCI()
    difference: MeanCI = MeanCI()


def qz_distribution(q: np.ndarray, *, n_boot: int = 1000, seed: int = 0, alpha: float = 0.05) -> QzDistribution:
    """Table 7: mean q_hat_Z with a percentile bootstrap CI, median, fraction = 0, fraction > 0.5."""
    q = np.asarray(q, dtype=float)
    q = q[np.isfinite(q)]
    if q.size == 0:
        return QzDistribution(n=0)
    boots = _bootstrap_means(q, n_boot, seed)
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    return QzDistribution(
        n=int(q.size),
        mean=float(q.mean()),
        ci=(float(lo), float(hi)),
        median=float(np.median(q)),
        frac_zero=float(np.mean(q == 0.0)),
        frac_above_half=float(np.mean(q > 0.5)),
    )


def paired_comparison(
    simple: np.ndarray, exact: np.ndarray, *, n_boot: int = 1000, seed: int = 0, alpha: float = 0.05
) -> PairedComparison:
    """Table 8: mean simple and exact-MC censored TPS and their paired difference, each with a bootstrap CI
    (the same prefix-level resamples for all three, so the difference CI is paired)."""
    simple = np.asarray(simple, dtype=float)
    exact = np.asarray(exact, dtype=float)
    if simple.shape != exact.shape:
        raise ValueError("simple and exact must be paired (same shape)")
    ok = np.isfinite(simple) & np.isfinite(exact)
    simple, exact = simple[ok], exact[ok]
    if simple.size == 0:
        return PairedComparison(n=0)
    vals = np.stack([simple, exact, exact - simple], axis=1)
    boots = _bootstrap_means(vals, n_boot, seed)
    qs = np.quantile(boots, [alpha / 2, 1 - alpha / 2], axis=0)
    parts = {
        name: MeanCI(mean=float(vals[:, j].mean()), ci=(float(qs[0, j]), float(qs[1, j])))
        for j, name in enumerate(("simple", "exact", "difference"))
    }
    return PairedComparison(n=int(simple.size), **parts)


def projection_identity_error(
    exact_scores: np.ndarray, branch_scores: np.ndarray, branch_prefix_index: np.ndarray
) -> tuple[float, np.ndarray]:
    """Conditional-projection identity (Appendix H.2; Eq. (13) with Proposition C.2):

    ``TPS^{cen,exact-MC}_i = (1/M_i^valid) sum_m TPS^{obs}(F_{i,1:Z_i}, Y_i^(m))``

    ``exact_scores[i]`` is the exact censored score of prefix i with ``q_hat^MC_i``; ``branch_scores[j]`` is the
    complete-data observable-prefix score of the frozen source forecasts F_{i,1:Z_i} against the outcome of
    valid branch j, and ``branch_prefix_index[j] = i``. Returns (max_i |difference|, per-prefix difference);
    prefixes without valid branches get NaN and are ignored in the max.
    """
    exact_scores = np.asarray(exact_scores, dtype=float)
    branch_scores = np.asarray(branch_scores, dtype=float)
    idx = np.asarray(branch_prefix_index, dtype=np.int64)
    n = exact_scores.size
    counts = np.bincount(idx, minlength=n)
    sums = np.bincount(idx, weights=branch_scores, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        branch_mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    diff = exact_scores - branch_mean
    finite = np.isfinite(diff)
    return (float(np.max(np.abs(diff[finite]))) if finite.any() else float("nan")), diff
