"""A predictor and a metric, each one entry point."""
from __future__ import annotations

import math

import numpy as np

from uqh.scoring.registry import Metric, Predictor


def last_token_prob(step, row) -> float:
    if row is None or not row.tokens:
        return float("nan")  # missing, never imputed
    return math.exp(row.tokens[-1].logprob)


def accuracy_at_half(c: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    hit = ((c >= 0.5) == (y == 1)).astype(float)
    return (w * hit).sum(axis=1) / w.sum(axis=1)


LAST_TOKEN_PROB = Predictor("last_token_prob", "Last-token probability", last_token_prob)
ACCURACY_AT_HALF = Metric("acc50", "accuracy of C >= 0.5", "Acc@0.5", True, "diagnostic", compute=accuracy_at_half)
