"""Per-step predictor values of one step, from its :class:`uqh.rundir.schema.Step` and accepted sidecar row.

Appendix F, "Per-step predictor pool". Each function returns a float in [0, 1], or NaN when the value is missing
(never imputed; :mod:`uqh.scoring.streams` skips and counts such trajectories):

- verbal confidence: the parsed <confidence> (``Step.verbal_confidence``; null -> missing), clipped to [0, 1];
- completion-token probability: mean over the step's generated tokens of exp(logprob);
- completion-entropy confidence: 1 - H/ln 5, H = mean over tokens of the Shannon entropy (nats) of the top-5
  alternatives renormalised to sum to one;
- the same two restricted to the tokens of the <action> content (``LogprobRow.action_token_range``).

Token values need the accepted attempt's sidecar row: no row, ``tokens: null``, an empty token list, a token
without alternatives (entropy) or no action range (action span) make the value missing.
"""
from __future__ import annotations

import math

import numpy as np

from uqh.rundir.schema import LogprobRow, Step, TokenLogprob

LN5 = math.log(5.0)
NAN = float("nan")


def token_probability(tokens: list[TokenLogprob] | None) -> float:
    """Mean chosen-token probability exp(logprob) over ``tokens``; NaN when there are none."""
    if not tokens:
        return NAN
    return float(np.mean(np.exp([t.logprob for t in tokens])))


def entropy_confidence(tokens: list[TokenLogprob] | None) -> float:
    """1 - H/ln 5 with H the mean (over tokens) Shannon entropy of the renormalised top-5 alternatives (nats)."""
    if not tokens:
        return NAN
    k = max(min(len(t.top_logprobs), 5) for t in tokens)
    if k == 0 or any(not t.top_logprobs for t in tokens):
        return NAN
    lp = np.full((len(tokens), k), -np.inf)
    for i, tok in enumerate(tokens):
        alts = tok.top_logprobs[:5]
        lp[i, : len(alts)] = [a.logprob for a in alts]
    if not np.all(np.isfinite(lp.max(axis=1))):
        return NAN
    lp -= lp.max(axis=1, keepdims=True)
    p = np.exp(lp)
    p /= p.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(p > 0, p * np.log(p), 0.0)
    return 1.0 - float(np.mean(-plogp.sum(axis=1))) / LN5


def action_tokens(row: LogprobRow) -> list[TokenLogprob] | None:
    """The tokens of the <action> content of a sidecar row, or None when unknown/empty/out of range."""
    if row.tokens is None or row.action_token_range is None:
        return None
    start, end = row.action_token_range
    if not (0 <= start < end <= len(row.tokens)):
        return None
    return row.tokens[start:end]


# ------------------------------------------------------------------------ per-step values (registry entries)


def verbal_value(step: Step, row: LogprobRow | None) -> float:
    c = step.verbal_confidence
    if c is None or not math.isfinite(c):
        return NAN
    return min(max(c, 0.0), 1.0)


def token_prob_value(step: Step, row: LogprobRow | None) -> float:
    return NAN if row is None else token_probability(row.tokens)


def token_entropy_value(step: Step, row: LogprobRow | None) -> float:
    return NAN if row is None else entropy_confidence(row.tokens)


def action_prob_value(step: Step, row: LogprobRow | None) -> float:
    return NAN if row is None else token_probability(action_tokens(row))


def action_entropy_value(step: Step, row: LogprobRow | None) -> float:
    return NAN if row is None else entropy_confidence(action_tokens(row))
