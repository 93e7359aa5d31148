"""Paired bootstrap over trajectories (§6.1 Δ/SE, Tables 8 and 12 CIs), vectorised across resamples.

A resample is a vector of multiplicities (counts) over the n trajectories; every statistic in this package
accepts such count matrices (shape (B, n)) and evaluates all B resamples at once. Resamples are drawn in
chunks from one seeded generator, so the resample sequence does not depend on the chunk size. Pairing:
every stream compared within one call sees the same resamples.
"""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

DEFAULT_RESAMPLES = 1000
DEFAULT_SEED = 0


def resample_counts(n: int, n_resamples: int, seed: int = DEFAULT_SEED, chunk: int = 64) -> Iterator[np.ndarray]:
    """Yield (b, n) float arrays of bootstrap counts (n draws with replacement per row), b <= chunk."""
    rng = np.random.default_rng(seed)
    done = 0
    while done < n_resamples:
        b = min(chunk, n_resamples - done)
        idx = rng.integers(0, n, size=(b, n))
        flat = (idx + (np.arange(b) * n)[:, None]).ravel()
        yield np.bincount(flat, minlength=b * n).reshape(b, n).astype(float)
        done += b


def paired_bootstrap(
    statistic: Callable[[np.ndarray], dict[str, np.ndarray]],
    n: int,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    chunk: int | None = None,
    workers: int = 1,
) -> dict[str, np.ndarray]:
    """Run ``statistic(counts (b, n)) -> {name: (b,)}`` on ``n_resamples`` resamples; returns {name: (B,)}.

    ``workers > 1`` evaluates chunks in a thread pool (numpy releases the GIL in its loops); the resamples are
    still drawn in order from one generator, so the result does not depend on ``workers`` or ``chunk``.
    """
    if n <= 0 or n_resamples <= 0:
        return {}
    if chunk is None:  # small blocks of resamples keep the (chunk, n) work arrays cache-resident
        chunk = max(1, min(256, 200_000 // max(n, 1)))
    parts: dict[str, list[np.ndarray]] = {}

    def collect(res: dict[str, np.ndarray]) -> None:
        for k, v in res.items():
            parts.setdefault(k, []).append(np.asarray(v, dtype=float))

    if workers <= 1:
        for counts in resample_counts(n, n_resamples, seed, chunk):
            collect(statistic(counts))
    else:
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending: deque = deque()
            for counts in resample_counts(n, n_resamples, seed, chunk):
                pending.append(pool.submit(statistic, counts))
                while len(pending) > 2 * workers:
                    collect(pending.popleft().result())
            while pending:
                collect(pending.popleft().result())
    return {k: np.concatenate(v) for k, v in parts.items()}


def interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap samples (NaN resamples ignored)."""
    s = np.asarray(samples, dtype=float)
    s = s[np.isfinite(s)]
    if s.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(s, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def standard_error(samples: np.ndarray) -> float:
    s = np.asarray(samples, dtype=float)
    s = s[np.isfinite(s)]
    return float(np.std(s, ddof=1)) if s.size > 1 else float("nan")


def compare(point_a: float, point_b: float, samples_a: np.ndarray, samples_b: np.ndarray, level: float = 0.95) -> dict:
    """Paired comparison b - a: Δ, its bootstrap SE, Δ/SE and the percentile CI of the paired differences."""
    diff = np.asarray(samples_b, dtype=float) - np.asarray(samples_a, dtype=float)
    delta = float(point_b - point_a)
    se = standard_error(diff)
    lo, hi = interval(diff, level)
    z = delta / se if (np.isfinite(se) and se > 0) else float("nan")
    return {"delta": delta, "se": se, "delta_over_se": z, "ci": [lo, hi]}
