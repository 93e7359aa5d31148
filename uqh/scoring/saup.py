"""SAUP: situation-awareness uncertainty propagation (Zhao et al., "SAUP: Situation Awareness Uncertainty
Propagation on LLM Agent", arXiv:2412.01033, ACL 2025), as a running per-step predictor.

SAUP aggregates one-step uncertainties U_i with situational weights W_i by a root mean square:
U_agent = sqrt((1/N) Σ_i (W_i U_i)²). Its distance-based weights (SAUP-ND) add an *inquiry drift* D_a (how far
step i's thought and action have moved from the question) and an *observation discrepancy* D_o (how far an action
and the observation it meets are apart): W_i = D_a,i + D_o,i. uqh's instance, from what a run directory records:

- U_i: the accepted completion's mean token NLL, −(1/n) Σ log p (a length-normalised one-step estimator);
- D_a,i = 1 − word-Jaccard(think_i + action_i, task prompt); D_o,i = 1 − word-Jaccard(action_i, o_{i−1}), the
  observation the action answers (the task prompt for step 1). The paper measures both with sentence embeddings
  (RoBERTa) and pairs action i with its own observation o_i; uqh uses word overlap (no model needed) and o_{i−1},
  because o_i is not yet seen at step i: F_t must be a function of H_t (docs/scoring.md, "Measurability");
- at step t the aggregate runs over steps 1..t, and the stream is exp(−U_agent,t) (decreasing in the uncertainty;
  a signal, not a probability: its raw row has the rank metrics, the Platt row every metric).

A step without token logprobs makes U_i, and so the value from that step on, missing (never imputed).
"""
from __future__ import annotations

import numpy as np

from uqh.scoring.process_features import SIGNAL_INDEX


def situational_weights(signals: np.ndarray) -> np.ndarray:
    """W_i = D_a,i + D_o,i per step."""
    return signals[:, SIGNAL_INDEX["drift"]] + signals[:, SIGNAL_INDEX["discrepancy"]]


def step_uncertainty(signals: np.ndarray) -> np.ndarray:
    """U_i: the accepted completion's mean token NLL (NaN without tokens)."""
    return -signals[:, SIGNAL_INDEX["token_mean_lp"]]


def saup_terms(signals: np.ndarray) -> np.ndarray:
    """(steps, 2) running terms: ((W_i U_i)², 1)."""
    wu = situational_weights(signals) * step_uncertainty(signals)
    return np.column_stack([wu * wu, np.ones(signals.shape[0])])


def saup_confidence(sum_squares: np.ndarray, n: np.ndarray) -> np.ndarray:
    """exp(−sqrt(Σ (W U)² / n)) of the running terms."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.exp(-np.sqrt(sum_squares / n))
