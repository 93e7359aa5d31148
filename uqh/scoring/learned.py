"""A learned trajectory calibrator: a regularised linear-logistic model on the prefix features of
:mod:`uqh.scoring.process_features` (HTC, arXiv:2601.15778), cross-fitted exactly as Platt is.

- Records: one per scored step, weighted by the TPS step weight w_t, with the trajectory's training label (Y, ΔY or
  a soft label, :mod:`uqh.scoring.labels`) as target -- the records and weights Platt is fitted on.
- Features: the columns of :data:`uqh.scoring.process_features.FEATURES` the sample records (a column missing on
  every scored step -- e.g. the logprob ones of a run without logprobs -- is dropped and named); each standardised
  with the training half's weighted mean and sd (floored at 1e-6).
- Fit: minimise −Σ w [y log p + (1−y) log(1−p)] + λ R(β), p = σ(α + x·β), intercept free, λ = 1 (Platt's); R = ½‖β‖²
  (``ridge``, the default; Newton) or ‖β‖₁ (``lasso``; proximal gradient).
- Cross-fitting: the stratified halves of :func:`uqh.scoring.calibration.stratified_split`; the model fitted on A
  predicts B and vice versa; a final clip to [1e-6, 1 − 1e-6].
- Transfer (``uqh score --calibrator-from RUN``, HTC's General Agent Calibrator): one model fitted on every scored
  step of another run applies to every step of this one (no cross-fitting: no label of this run is used).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from uqh.scoring.calibration import EPS, LAMBDA, SIGMA_FLOOR, sigmoid, stratified_split
from uqh.scoring.labels import split_strata, training_labels
from uqh.scoring.results import LearnedCalibration, LearnedModel
from uqh.scoring.weights import step_index

PENALTIES = ("ridge", "lasso")


@dataclass
class LogisticModel:
    """σ(α + ((x − μ)/σ)·β) on the named feature columns."""

    features: list[str]
    intercept: float
    coef: np.ndarray
    mu: np.ndarray
    sd: np.ndarray
    n_trajectories: int
    n_steps: int

    def __call__(self, x: np.ndarray) -> np.ndarray:
        z = (x - self.mu) / self.sd
        return np.clip(sigmoid(self.intercept + z @ self.coef), EPS, 1.0 - EPS)

    def summary(self) -> LearnedModel:
        return LearnedModel(intercept=self.intercept, weights=[float(b) for b in self.coef],
                            n_train_trajectories=self.n_trajectories, n_train_steps=self.n_steps)


def _ridge(z: np.ndarray, y: np.ndarray, w: np.ndarray, lam: float, theta: np.ndarray) -> np.ndarray:
    """Newton's method on the ridge objective (intercept unpenalised), damped by halving on a worse objective."""
    d = z.shape[1]
    x = np.column_stack([np.ones(len(y)), z])
    pen = np.full(d + 1, lam)
    pen[0] = 0.0

    def objective(th: np.ndarray) -> float:
        u = x @ th
        return float((w * (np.logaddexp(0.0, u) - y * u)).sum() + 0.5 * (pen * th * th).sum())

    f = objective(theta)
    for _ in range(100):
        p = sigmoid(x @ theta)
        g = x.T @ (w * (p - y)) + pen * theta
        h = (x * (w * p * (1 - p))[:, None]).T @ x + np.diag(pen) + 1e-10 * np.eye(d + 1)
        step = np.linalg.solve(h, g)
        t = 1.0
        while objective(theta - t * step) > f + 1e-15 and t > 1e-8:
            t *= 0.5
        theta = theta - t * step
        f_new = objective(theta)
        if abs(f - f_new) < 1e-12 * max(1.0, abs(f)):
            break
        f = f_new
    return theta


def _lasso(z: np.ndarray, y: np.ndarray, w: np.ndarray, lam: float, theta: np.ndarray) -> np.ndarray:
    """FISTA on the lasso objective (intercept unpenalised; soft-thresholding of the slopes)."""
    x = np.column_stack([np.ones(len(y)), z])
    lipschitz = 0.25 * np.linalg.eigvalsh((x * w[:, None]).T @ x).max() + 1e-12
    step = 1.0 / lipschitz
    v, prev, k = theta.copy(), theta.copy(), 1.0
    for _ in range(5000):
        g = x.T @ (w * (sigmoid(x @ v) - y))
        nxt = v - step * g
        nxt[1:] = np.sign(nxt[1:]) * np.maximum(np.abs(nxt[1:]) - step * lam, 0.0)
        k_next = (1 + np.sqrt(1 + 4 * k * k)) / 2
        v = nxt + ((k - 1) / k_next) * (nxt - prev)
        if np.max(np.abs(nxt - prev)) < 1e-10:
            prev = nxt
            break
        prev, k = nxt, k_next
    return prev


def fit_logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray, features: list[str], *, penalty: str = "ridge",
                 lam: float = LAMBDA, n_trajectories: int = 0) -> LogisticModel:
    """Fit one model on per-step records (features, label in [0, 1], weight)."""
    if penalty not in PENALTIES:
        raise ValueError(f"unknown penalty {penalty!r}; use ridge or lasso")
    sw = w.sum()
    if x.shape[0] == 0 or sw <= 0:
        raise ValueError("a learned calibrator needs at least one weighted training record")
    mu = (w[:, None] * x).sum(axis=0) / sw
    sd = np.maximum(np.sqrt((w[:, None] * (x - mu) ** 2).sum(axis=0) / sw), SIGMA_FLOOR)
    z = (x - mu) / sd
    ybar = float((w * y).sum() / sw)
    theta = np.zeros(x.shape[1] + 1)
    theta[0] = np.log(np.clip(ybar, EPS, 1 - EPS)) - np.log1p(-np.clip(ybar, EPS, 1 - EPS))
    if 0.0 < ybar < 1.0:
        theta = (_ridge if penalty == "ridge" else _lasso)(z, y, w, lam, theta)
    return LogisticModel(list(features), float(theta[0]), theta[1:], mu, sd, n_trajectories, int(x.shape[0]))


def recorded_columns(features: np.ndarray) -> np.ndarray:
    """Which feature columns have a value on at least one step (the others are not recorded by the run)."""
    return np.isfinite(features).any(axis=0) if features.size else np.zeros(features.shape[1], dtype=bool)


def _records(offsets, y, delta, q_z, labels):
    target = training_labels(np.asarray(y, dtype=float), np.asarray(delta, dtype=bool), q_z, labels)
    traj, _ = step_index(np.asarray(offsets, dtype=np.int64))
    return target, traj


def cross_fit(features: np.ndarray, names: list[str], offsets, y, delta, episode_ids, weights, *,
              labels: str, q_z=None, penalty: str = "ridge", lam: float = LAMBDA
              ) -> tuple[np.ndarray, tuple[LogisticModel, LogisticModel]]:
    """Cross-fitted values of the model on every step (A's model predicts B and vice versa) and both models."""
    target, traj = _records(offsets, y, delta, q_z, labels)
    half = stratified_split(episode_ids, *split_strata(np.asarray(y, float), np.asarray(delta, bool), labels))
    train = np.isfinite(target)
    step_half, step_train = half[traj], train[traj]
    y_step = np.where(train, target, 0.0)[traj]
    models = []
    for h in (0, 1):
        m = (step_half == h) & step_train
        if not m.any():
            raise ValueError(f"split {'AB'[h]} has no trajectory to fit the learned calibrator on")
        models.append(fit_logistic(features[m], y_step[m], weights[m], names, penalty=penalty, lam=lam,
                                   n_trajectories=int((train & (half == h)).sum())))
    out = np.empty(features.shape[0])
    for h in (0, 1):
        m = step_half == h
        out[m] = models[1 - h](features[m])
    return out, (models[0], models[1])


def fit_all(features: np.ndarray, names: list[str], offsets, y, delta, weights, *, labels: str, q_z=None,
            penalty: str = "ridge", lam: float = LAMBDA) -> LogisticModel:
    """One model on every trained step of a sample (the source run of a transfer)."""
    target, traj = _records(offsets, y, delta, q_z, labels)
    train = np.isfinite(target)
    m = train[traj]
    return fit_logistic(features[m], target[traj][m], weights[m], names, penalty=penalty, lam=lam,
                        n_trajectories=int(train.sum()))


def calibration_result(predictor: str, names: list[str], dropped: list[str], penalty: str, lam: float,
                       models: tuple[LogisticModel, ...], transfer_from: str | None) -> LearnedCalibration:
    """The typed summary of a learned calibrator (its weights per standardised feature, one model per split)."""
    return LearnedCalibration(predictor=predictor, penalty=penalty, lam=lam, features=list(names),
                              dropped_features=list(dropped), models=[m.summary() for m in models],
                              transfer_from=transfer_from)
