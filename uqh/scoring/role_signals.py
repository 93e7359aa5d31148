"""agentuq's per-role summaries as running per-step predictors: the assistant's, the simulated user's and both.

agentuq (``deeplearning-wisc/agentuq``, ``src/tau2/utils/uq_logprobs.py``, ``get_trajectory_uq_summary``) sums up
a Tau2 trajectory per role -- ``assistant``, ``user`` and ``combined`` -- with five numbers: total tokens,
trajectory NLL, avg token NLL, min chosen probability and mean top-k entropy
(:func:`uqh.scoring.token_signals.role_summary` reproduces them). Here each becomes a running confidence: the value
at step t summarises the role's tokens up to step t, so the value at the last step is agentuq's summary of the whole
trajectory, mapped:

- ``gmean_prob``: exp(-avg token NLL);  ``traj_prob``: exp(-trajectory NLL);  ``min_prob``: min chosen probability;
- ``entropy``: 1 - mean over tokens of H_t / ln K (agentuq's ``mean_topk_entropy``, each token's entropy on the
  0..1 scale of its call's top-k width K);
- ``tokens``: 1 / (1 + n / 1000), n the total tokens (any decreasing map gives the same rank diagnostics; the scale
  -- 1000 tokens give 0.5 -- only matters for the raw TPS rows, which the Platt rows recalibrate).

Tokens per step: the assistant's are the accepted call's (as every token predictor's); the user's are the user
sidecar's rows numbered t - 1 (row t is the user's reply to step t's action, which enters step t + 1's information
set; the opening turn, numbered 0, counts at step 1; the reply to the last action enters no step).
A step without a user turn adds nothing; a call without logprobs, or a token without top-k for ``entropy``, makes
the value missing from that step on (never imputed). Without a user sidecar the user and combined values are missing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from uqh.rundir.schema import TokenLogprob
from uqh.scoring.token_signals import chosen_logprobs, topk_entropies

ROLES = ("assistant", "user", "combined")
NAN = float("nan")
#: The token count that maps to confidence 0.5 (``tokens`` predictors).
TOKENS_HALF_CONFIDENCE = 1000.0

Tokens = "list[TokenLogprob] | None"


@dataclass(frozen=True)
class RoleRunning:
    """A running per-role predictor: per-step terms (value, token count) of a role's tokens, accumulated along the
    trajectory (the value by ``accumulate``, the count by sum), then mapped to a confidence."""

    role: Literal["assistant", "user", "combined"]
    terms: Callable[[list[TokenLogprob] | None], tuple[float, float]]
    accumulate: Literal["sum", "max"]
    confidence: Callable[[np.ndarray, np.ndarray], np.ndarray]  # (accumulated value, token count) -> values


def nll_terms(tokens: list[TokenLogprob] | None) -> tuple[float, float]:
    """(sum of -logprob, tokens); (0, 0) for a call without tokens, NaN for one without logprobs."""
    if tokens is None:
        return NAN, NAN
    lp = chosen_logprobs(tokens)
    return float(-lp.sum()), float(lp.size)


def max_nll_terms(tokens: list[TokenLogprob] | None) -> tuple[float, float]:
    """(largest -logprob, tokens): the running max gives the minimum chosen probability."""
    if tokens is None:
        return NAN, NAN
    lp = chosen_logprobs(tokens)
    return (float(-lp.min()), float(lp.size)) if lp.size else (-math.inf, 0.0)


def entropy_terms(tokens: list[TokenLogprob] | None) -> tuple[float, float]:
    """(sum over tokens of H_t / ln K, tokens), K the call's top-k width; NaN when a token has no alternatives
    or K < 2."""
    if tokens is None:
        return NAN, NAN
    if not tokens:
        return 0.0, 0.0
    ent = topk_entropies(tokens)
    if ent is None or ent[1] < 2:
        return NAN, NAN
    h, k = ent
    return float(h.sum() / math.log(k)), float(h.size)


def count_terms(tokens: list[TokenLogprob] | None) -> tuple[float, float]:
    if tokens is None:
        return NAN, NAN
    return float(len(tokens)), float(len(tokens))


def _with_tokens(values: np.ndarray, n: np.ndarray) -> np.ndarray:
    return np.where(n > 0, values, np.nan)


def gmean_confidence(total: np.ndarray, n: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return _with_tokens(np.exp(-total / n), n)


def probability_confidence(total: np.ndarray, n: np.ndarray) -> np.ndarray:
    return _with_tokens(np.exp(-total), n)


def entropy_confidence(total: np.ndarray, n: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return _with_tokens(np.clip(1.0 - total / n, 0.0, 1.0), n)


def tokens_confidence(total: np.ndarray, n: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + n / TOKENS_HALF_CONFIDENCE)


#: name suffix -> (label, terms, accumulate, confidence)
SUMMARIES = {
    "gmean_prob": ("geometric-mean token probability to date (exp(-avg NLL))", nll_terms, "sum", gmean_confidence),
    "traj_prob": ("trajectory probability to date (exp(-trajectory NLL))", nll_terms, "sum", probability_confidence),
    "min_prob": ("minimum chosen-token probability to date", max_nll_terms, "max", probability_confidence),
    "entropy": ("mean top-k entropy confidence to date", entropy_terms, "sum", entropy_confidence),
    "tokens": ("total tokens to date, as 1/(1+n/1000)", count_terms, "sum", tokens_confidence),
}


def combine(a: np.ndarray, b: np.ndarray, accumulate: str) -> np.ndarray:
    """Two (value, count) term arrays of the same steps as one (a role's calls within a step, or both roles)."""
    first = np.maximum(a[:, 0], b[:, 0]) if accumulate == "max" else a[:, 0] + b[:, 0]
    return np.column_stack([first, a[:, 1] + b[:, 1]])


def empty_terms(n: int, accumulate: str) -> np.ndarray:
    """Terms of ``n`` steps without tokens (the identity of :func:`combine`)."""
    out = np.zeros((n, 2))
    if accumulate == "max":
        out[:, 0] = -math.inf
    return out


def running_max_within(terms: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Running (max of the values, sum of the counts) within each trajectory; a step whose count is NaN (a call
    without logprobs) makes it and every later step of its trajectory NaN (the ``max`` accumulation; sums use
    :func:`uqh.scoring.streams.cumulative_within`). Vectorised over a (trajectories, longest) grid."""
    terms = np.asarray(terms, dtype=float)
    out = np.full_like(terms, np.nan)
    lengths = np.diff(offsets)
    if terms.shape[0] == 0:
        return out
    row = np.repeat(np.arange(lengths.size), lengths)
    col = np.arange(terms.shape[0]) - np.repeat(offsets[:-1], lengths)
    values = np.full((lengths.size, int(lengths.max())), -np.inf)
    values[row, col] = np.where(np.isnan(terms[:, 0]), -np.inf, terms[:, 0])
    counts = np.zeros_like(values)
    missing = np.zeros(values.shape, dtype=bool)
    counts[row, col] = np.nan_to_num(terms[:, 1])
    missing[row, col] = ~np.isfinite(terms[:, 1])
    bad = np.logical_or.accumulate(missing, axis=1)[row, col]
    out[:, 0] = np.maximum.accumulate(values, axis=1)[row, col]
    out[:, 1] = np.cumsum(counts, axis=1)[row, col]
    out[bad] = np.nan
    return out


# ------------------------------------------------------------------------ agentuq's conventions (opt-in)


def agentuq_entropy_terms(tokens: list[TokenLogprob] | None) -> tuple[float, float]:
    """agentuq's entropy accumulation: (sum of each token's top-k entropy in nats -- 0 for a token without top-k,
    which still counts --, tokens). Its floor p >= 1e-12 inside the log moves values by < 1e-10."""
    if tokens is None:
        return NAN, NAN
    if not tokens:
        return 0.0, 0.0
    total = 0.0
    for tok in tokens:
        if tok.top_logprobs:
            ent = topk_entropies([tok])
            total += float(ent[0][0])
    return total, float(len(tokens))


def nats_entropy_confidence(total: np.ndarray, n: np.ndarray) -> np.ndarray:
    """exp(−mean entropy in nats): decreasing in agentuq's ``mean_topk_entropy`` (same rank metrics)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return _with_tokens(np.exp(-total / n), n)


#: under agentuq's conventions, a summary's (terms, confidence) is replaced by these
AGENTUQ_VARIANTS = {entropy_terms: (agentuq_entropy_terms, nats_entropy_confidence)}


def with_conventions(role: RoleRunning, agentuq: bool) -> RoleRunning:
    """``role`` under agentuq's conventions (entropy in nats, a token without top-k counted with entropy 0) or as is."""
    if not agentuq or role.terms not in AGENTUQ_VARIANTS:
        return role
    terms, confidence = AGENTUQ_VARIANTS[role.terms]
    return RoleRunning(role.role, terms, role.accumulate, confidence)
