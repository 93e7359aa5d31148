"""White-box token signals of the agent-UQ literature, from the recorded tokens of one step (no new model call).

Each function takes the tokens of one span -- the whole completion or the <action> content
(:func:`uqh.scoring.step_values.action_tokens`) -- and returns a confidence in [0, 1], or NaN when missing (never
imputed). Definitions follow agentuq (``deeplearning-wisc/agentuq``, ``src/tau2/utils/uq_logprobs.py``: per-token
``chosen_logprob``, ``chosen_prob``, ``topk_entropy``, ``topk_mass``; per-role ``avg_token_nll``,
``trajectory_nll``, ``min_chosen_prob``, ``mean_topk_entropy``), uqlm's white-box scorers (minimum token
probability) and G-NLL (Aichberger et al. 2024, greedy decoding only, as AgentUQ refuses it on sampled runs).

Mappings to a confidence (documented in docs/scoring.md, "Token signals"):

- geometric-mean probability exp(-avg NLL), avg NLL = mean over tokens of -logprob (agentuq ``avg_token_nll``);
- minimum chosen-token probability min_t exp(logprob_t) (agentuq ``min_chosen_prob``, uqlm ``min_probability``);
- top-k mass: mean over tokens of sum_j exp(top_logprob_j), clipped to 1 (agentuq per-token ``topk_mass``);
- max top-k entropy: 1 - max_t H_t / ln K, H_t agentuq's ``topk_entropy`` (Shannon entropy, nats, of all recorded
  alternatives renormalised to sum to one), K the widest top-k of the span (a uniform top-K gives 0);
- G-NLL: exp(-sum_t -logprob_t), the probability of the greedy completion;
- running terms (sum NLL, token count) of a step, combined along the trajectory by :mod:`uqh.scoring.streams` into
  exp(-cumulative NLL) (agentuq ``trajectory_nll`` to date) and exp(-cumulative NLL / cumulative tokens) (agentuq
  ``avg_token_nll`` to date); likewise (sum H_t / ln K, token count) into 1 - the mean normalised top-k entropy of
  every token so far (agentuq ``mean_topk_entropy`` to date, on the 0..1 scale).

A signal that needs top-k (mass, entropy) is missing when any token of the span has no alternatives: agentuq adds
nothing to its entropy sum for such a token but still counts it in the mean (an imputed 0); uqh does not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from uqh.rundir.schema import LogprobRow, Step, TokenLogprob
from uqh.scoring.step_values import action_tokens

NAN = float("nan")


def chosen_logprobs(tokens: list[TokenLogprob] | None) -> np.ndarray:
    """The chosen tokens' natural-log probabilities (empty when there are none)."""
    return np.array([t.logprob for t in tokens or ()], dtype=float)


def geometric_mean_probability(tokens: list[TokenLogprob] | None) -> float:
    """exp(-avg NLL): the geometric-mean chosen-token probability (agentuq ``avg_token_nll`` mapped)."""
    lp = chosen_logprobs(tokens)
    return float(np.exp(lp.mean())) if lp.size else NAN


def minimum_probability(tokens: list[TokenLogprob] | None) -> float:
    """min over tokens of exp(logprob) (agentuq ``min_chosen_prob``; uqlm's minimum token probability)."""
    lp = chosen_logprobs(tokens)
    return float(np.exp(lp.min())) if lp.size else NAN


def sequence_probability(tokens: list[TokenLogprob] | None) -> float:
    """exp(-sum NLL): the probability of the whole span; on a greedy run exp(-G-NLL) (Aichberger et al. 2024)."""
    lp = chosen_logprobs(tokens)
    return float(np.exp(lp.sum())) if lp.size else NAN


def nll_terms(tokens: list[TokenLogprob] | None) -> tuple[float, float]:
    """(sum of -logprob, number of tokens) of a span, the running terms of the trajectory-NLL signals; NaN, NaN
    when the span has no tokens (the running value is missing from this step on)."""
    lp = chosen_logprobs(tokens)
    return (float(-lp.sum()), float(lp.size)) if lp.size else (NAN, NAN)


def top_logprob_matrix(tokens: list[TokenLogprob] | None) -> np.ndarray | None:
    """(tokens, K) matrix of the recorded alternatives' logprobs, -inf padded; None when a token has none."""
    if not tokens or any(not t.top_logprobs for t in tokens):
        return None
    k = max(len(t.top_logprobs) for t in tokens)
    lp = np.full((len(tokens), k), -np.inf)
    for i, tok in enumerate(tokens):
        lp[i, : len(tok.top_logprobs)] = [a.logprob for a in tok.top_logprobs]
    return lp


def normalised_entropy_terms(tokens: list[TokenLogprob] | None) -> tuple[float, float]:
    """(sum over tokens of H_t / ln K, number of tokens): the running terms of the mean top-k entropy to date
    (agentuq ``mean_topk_entropy``, each token's entropy on the 0..1 scale of the span's top-k width K); NaN, NaN
    when a token has no alternatives or K < 2."""
    ent = topk_entropies(tokens)
    if ent is None or ent[1] < 2:
        return NAN, NAN
    h, k = ent
    return float(h.sum() / math.log(k)), float(h.size)


def topk_mass(tokens: list[TokenLogprob] | None) -> float:
    """Mean over tokens of the probability mass of the recorded top-k alternatives (agentuq ``topk_mass``)."""
    lp = top_logprob_matrix(tokens)
    if lp is None:
        return NAN
    return min(float(np.exp(lp).sum(axis=1).mean()), 1.0)


def topk_entropies(tokens: list[TokenLogprob] | None) -> tuple[np.ndarray, int] | None:
    """Per-token agentuq ``topk_entropy`` (nats, alternatives renormalised) and the span's top-k width K."""
    lp = top_logprob_matrix(tokens)
    if lp is None:
        return None
    p = np.exp(lp)
    p /= p.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(p > 0, p * np.log(p), 0.0)
    return -plogp.sum(axis=1), lp.shape[1]


def max_entropy_confidence(tokens: list[TokenLogprob] | None) -> float:
    """1 - max_t H_t / ln K (K >= 2; with one alternative the entropy scale is undefined: missing)."""
    ent = topk_entropies(tokens)
    if ent is None or ent[1] < 2:
        return NAN
    h, k = ent
    return float(np.clip(1.0 - h.max() / math.log(k), 0.0, 1.0))


def mean_topk_entropy(tokens: list[TokenLogprob] | None) -> float:
    """agentuq's ``mean_topk_entropy`` of a span in nats (not a confidence; for the per-role summaries)."""
    ent = topk_entropies(tokens)
    return float(ent[0].mean()) if ent is not None else NAN


# ------------------------------------------------------------------------ per-step values (registry entries)

SPANS = ("token", "action")  # the whole completion, the <action> content


def span_tokens(row: LogprobRow | None, span: str) -> list[TokenLogprob] | None:
    """The tokens of ``span`` ("token": the completion, "action": the <action> content) of a step's sidecar row."""
    if row is None:
        return None
    return row.tokens if span == "token" else action_tokens(row)


def span_value(signal: Callable[[list[TokenLogprob] | None], float], span: str):
    """The registry's per-step function (step, row) -> value of ``signal`` on ``span``."""

    def value(step: Step, row: LogprobRow | None) -> float:
        return signal(span_tokens(row, span))

    value.__name__ = f"{span}_{signal.__name__}"
    return value


def span_nll_terms(span: str):
    """The registry's per-step running terms (step, row) -> (sum NLL, tokens) on ``span``."""

    def terms(step: Step, row: LogprobRow | None) -> tuple[float, float]:
        return nll_terms(span_tokens(row, span))

    terms.__name__ = f"{span}_nll_terms"
    return terms


def span_entropy_terms(span: str):
    """The registry's per-step running terms (step, row) -> (sum H/ln K, tokens) on ``span``."""

    def terms(step: Step, row: LogprobRow | None) -> tuple[float, float]:
        return normalised_entropy_terms(span_tokens(row, span))

    terms.__name__ = f"{span}_entropy_terms"
    return terms


def trajectory_entropy_confidence(cum_entropy: np.ndarray, cum_tokens: np.ndarray) -> np.ndarray:
    """1 − (mean normalised top-k entropy of every token so far) (agentuq ``mean_topk_entropy`` to date)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(1.0 - cum_entropy / cum_tokens, 0.0, 1.0)


def trajectory_probability(cum_nll: np.ndarray, cum_tokens: np.ndarray) -> np.ndarray:
    """exp(-cumulative NLL to date): the probability of every token generated so far (agentuq ``trajectory_nll``)."""
    return np.exp(-cum_nll)


def trajectory_geometric_mean(cum_nll: np.ndarray, cum_tokens: np.ndarray) -> np.ndarray:
    """exp(-cumulative NLL / cumulative tokens) to date (agentuq ``avg_token_nll`` of the trajectory so far)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.exp(-cum_nll / cum_tokens)


# ------------------------------------------------------------------------ agentuq's per-role summaries


@dataclass(frozen=True)
class RoleSummary:
    """agentuq's trajectory-level ``uq_summary`` of one role (assistant, user or combined) over its calls' tokens."""

    total_tokens: int
    trajectory_nll: float  # sum of -logprob over every token
    avg_token_nll: float  # trajectory_nll / total_tokens (NaN without tokens; agentuq: None)
    mean_topk_entropy: float  # mean agentuq topk_entropy (NaN when a token has no top-k; agentuq counts it as 0)
    min_chosen_prob: float  # NaN without tokens (agentuq: None)


def role_summary(calls: Iterable[list[TokenLogprob] | None]) -> RoleSummary:
    """agentuq's ``get_trajectory_uq_summary`` for one role (or, given both roles' calls, for ``combined``).

    The one deliberate difference: a token without top-k alternatives makes ``mean_topk_entropy`` missing (NaN);
    agentuq adds nothing to its entropy sum but still divides by the token, an imputed entropy of 0."""
    tokens = [t for call in calls for t in (call or ())]
    lp = chosen_logprobs(tokens)
    if not lp.size:
        return RoleSummary(0, 0.0, NAN, NAN, NAN)
    ent = topk_entropies(tokens)
    return RoleSummary(
        total_tokens=int(lp.size),
        trajectory_nll=float(-lp.sum()),
        avg_token_nll=float(-lp.sum() / lp.size),
        mean_topk_entropy=float(ent[0].mean()) if ent is not None else NAN,
        min_chosen_prob=float(np.exp(lp.min())),
    )
