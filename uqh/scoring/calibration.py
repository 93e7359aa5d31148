"""Single-split cross-fitted Platt scaling, exactly as Appendix D of the paper.

1. Split: trajectories are split 50/50 stratified by their label; within each label they are ordered by the
   stable trajectory id (``episode_id``) and alternated between halves A and B (the alternation continues across
   labels, so the halves differ in size by at most one). Which label depends on the label convention
   (:mod:`uqh.scoring.labels`): ΔY under ``delta_y`` and ``soft`` (censored trajectories join the failures), Y under
   ``complete`` (censored trajectories a third stratum: calibrated by the map of the *other* half, never fitted on).
2. Feature: x_raw = logit(clip(F, 1e-6, 1-1e-6)); standardised with the training half's weighted mean and
   weighted sd (weights = the TPS step weights w_t), sd floored at 1e-6.
3. Fit: p = sigmoid(a + b x) by weighted maximum likelihood on per-step records (sample weights w_t, not
   class-balanced) with an L2 penalty λ=1 on the slope only: minimise
   ``-Σ w [y log p + (1-y) log(1-p)] + (λ/2) b²`` (the scikit-learn ``C = 1/λ`` convention; intercept free).
   The target y is the trajectory's training label: Y, ΔY, or a soft label in [0, 1] (q̂_Z of a censored
   trajectory) -- the same objective with a fractional target (weighted logistic regression on soft labels).
4. Monotone fallback: if b < 0, set b = 0 and a = logit(ȳ_train) (the training labels' weighted mean).
5. Cross-fitting: the map fitted on A calibrates B and vice versa; a final clip to [1e-6, 1-1e-6].
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from uqh.scoring.labels import split_strata, training_labels
from uqh.scoring.results import PlattDiagnostics, PlattMapSummary
from uqh.scoring.weights import step_index

EPS = 1e-6
SIGMA_FLOOR = 1e-6
LAMBDA = 1.0
REFERENCE_VALUES = (0.90, 0.95, 1.00)


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=float), EPS, 1.0 - EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(u: np.ndarray) -> np.ndarray:
    from scipy.special import expit

    return expit(np.asarray(u, dtype=float))


@dataclass
class PlattMap:
    """One fitted calibration map ``F -> clip(sigmoid(a + b (logit F - mu) / max(sigma, 1e-6)))``."""

    a: float
    b: float
    b_fitted: float  # slope before the monotone fallback
    fallback: bool  # b_fitted < 0 (or the fit was degenerate) -> b = 0, a = logit(ybar_train)
    degenerate: bool  # all training labels equal: no slope is identifiable
    mu: float
    sigma: float
    sigma_floor_active: bool
    ybar_train: float
    n_train_trajectories: int
    n_train_steps: int

    def __call__(self, values: np.ndarray) -> np.ndarray:
        x = (logit(values) - self.mu) / max(self.sigma, SIGMA_FLOOR)
        return np.clip(sigmoid(self.a + self.b * x), EPS, 1.0 - EPS)

    def summary(self) -> PlattMapSummary:
        """The fitted parameters and the calibrated value of a few reference forecasts (Appendix D table)."""
        ref = {f"{v:.2f}": float(self(np.array([v]))[0]) for v in REFERENCE_VALUES}
        return PlattMapSummary(**asdict(self), reference_map=ref)


def stratified_split(episode_ids: np.ndarray, y: np.ndarray, delta: np.ndarray | None = None) -> np.ndarray:
    """Half (0 = A, 1 = B) of every trajectory: by label (Y=0, Y=1, then censored), ordered by id, alternating."""
    ids = np.asarray(episode_ids).astype(str)
    y = np.asarray(y, dtype=float)
    delta = np.ones(ids.size, dtype=bool) if delta is None else np.asarray(delta, dtype=bool)
    half = np.zeros(ids.size, dtype=np.int64)
    k = 0
    for stratum in (delta & (y == 0), delta & (y == 1), ~delta):
        idx = np.flatnonzero(stratum)
        idx = idx[np.argsort(ids[idx], kind="stable")]
        half[idx] = (np.arange(idx.size) + k) % 2
        k += idx.size
    return half


def fit_platt(values: np.ndarray, y: np.ndarray, w: np.ndarray, *, lam: float = LAMBDA, n_trajectories: int = 0) -> PlattMap:
    """Fit one Platt map on per-step records (forecast, trajectory label in [0, 1], step weight) -- Appendix D.
    A fractional label is a soft target: the record counts as y successes and 1 - y failures of weight w."""
    values = np.asarray(values, dtype=float)
    y = np.asarray(y, dtype=float)
    w = np.asarray(w, dtype=float)
    if values.size == 0 or w.sum() <= 0:
        raise ValueError("Platt fit needs at least one weighted training record")
    xr = logit(values)
    sw = w.sum()
    mu = float((w * xr).sum() / sw)
    sigma = float(np.sqrt((w * (xr - mu) ** 2).sum() / sw))
    x = (xr - mu) / max(sigma, SIGMA_FLOOR)
    ybar = float((w * y).sum() / sw)
    degenerate = ybar <= 0.0 or ybar >= 1.0
    a_fb = float(logit(np.array([ybar]))[0])
    if degenerate:
        return PlattMap(a_fb, 0.0, 0.0, True, True, mu, sigma, sigma < SIGMA_FLOOR, ybar, n_trajectories, values.size)
    theta = np.array([a_fb, 0.0])

    # (np.einsum rather than BLAS dot products: OpenBLAS threads long dots, which stalls on a busy machine)
    def grad_hess(th: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = sigmoid(th[0] + th[1] * x)
        r = w * (p - y)
        h = w * p * (1.0 - p)
        hx = h * x
        g = np.array([r.sum(), np.einsum('i,i->', r, x) + lam * th[1]])
        hess = np.array([[h.sum(), hx.sum()], [hx.sum(), np.einsum('i,i->', hx, x) + lam]])
        return g, hess

    # Newton's method on the convex objective  sum w [log(1+e^u) - y u] + (lam/2) b^2 ; a step is accepted when it
    # reduces the gradient norm (halved otherwise), which avoids extra passes to evaluate the objective.
    g, hess = grad_hess(theta)
    for _ in range(100):
        step = np.linalg.solve(hess + 1e-12 * np.eye(2), g)
        t = 1.0
        while True:
            cand = theta - t * step
            g_c, hess_c = grad_hess(cand)
            if np.abs(g_c).max() < np.abs(g).max() or t < 1e-6:
                break
            t *= 0.5
        theta, g, hess = cand, g_c, hess_c
        if np.max(np.abs(t * step)) < 1e-12 or np.abs(g).max() < 1e-12 * max(1.0, sw):
            break
    a, b = float(theta[0]), float(theta[1])
    if b < 0:
        return PlattMap(a_fb, 0.0, b, True, False, mu, sigma, sigma < SIGMA_FLOOR, ybar, n_trajectories, values.size)
    return PlattMap(a, b, b, False, False, mu, sigma, sigma < SIGMA_FLOOR, ybar, n_trajectories, values.size)


@dataclass
class CrossFitResult:
    values: np.ndarray  # calibrated flat stream (same layout as the input)
    half: np.ndarray  # per trajectory: 0 = A, 1 = B
    maps: tuple[PlattMap, PlattMap]  # (fitted on A, fitted on B)

    def diagnostics(self, predictor: str = "") -> PlattDiagnostics:
        return PlattDiagnostics(
            predictor=predictor,
            split_a=self.maps[0].summary(),
            split_b=self.maps[1].summary(),
            fallback_triggered=bool(self.maps[0].fallback or self.maps[1].fallback),
            calibrated_min=float(self.values.min()) if self.values.size else None,
            calibrated_max=float(self.values.max()) if self.values.size else None,
            n_a=int((self.half == 0).sum()),
            n_b=int((self.half == 1).sum()),
        )


def cross_fit_platt(
    values: np.ndarray,
    offsets: np.ndarray,
    y: np.ndarray,
    delta: np.ndarray,
    episode_ids: np.ndarray,
    weights: np.ndarray,
    *,
    labels: str = "delta_y",
    q_z: np.ndarray | None = None,
    lam: float = LAMBDA,
) -> CrossFitResult:
    """Cross-fitted Platt calibration of a per-step stream (Appendix D), trained on the labels of the convention
    ``labels`` (:mod:`uqh.scoring.labels`: ``delta_y``, ``soft`` -- needs ``q_z`` -- or ``complete``; without censored
    trajectories all three are the same). Raises ValueError when a half has no trajectory to fit on."""
    offsets = np.asarray(offsets, dtype=np.int64)
    delta = np.asarray(delta, dtype=bool)
    y = np.asarray(y, dtype=float)
    target = training_labels(y, delta, q_z, labels)
    half = stratified_split(episode_ids, *split_strata(y, delta, labels))
    train = np.isfinite(target)
    traj, _ = step_index(offsets)
    step_half = half[traj]
    step_train = train[traj]
    y_step = np.where(train, target, 0.0)[traj]
    maps = []
    for h in (0, 1):
        m = (step_half == h) & step_train
        if not m.any():
            what = "complete trajectory" if labels == "complete" else "trajectory"
            raise ValueError(f"split {'AB'[h]} has no {what} to fit a Platt map on")
        n_train = int((train & (half == h)).sum())
        maps.append(fit_platt(values[m], y_step[m], weights[m], lam=lam, n_trajectories=n_train))
    out = np.empty_like(np.asarray(values, dtype=float))
    for h in (0, 1):
        m = step_half == h
        out[m] = maps[1 - h](values[m])  # held-out: the map fitted on the other half
    return CrossFitResult(out, half, (maps[0], maps[1]))
