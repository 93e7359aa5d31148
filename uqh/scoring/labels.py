"""Which outcome labels the base rate and Platt calibration are trained on when the sample has censored trajectories.

Three conventions (docs/scoring.md, "Labels"):

- ``complete`` -- Y of the complete trajectories only; censored trajectories are calibrated by the other half's map
  but never enter a fit or the base rate. The only convention under ``--censoring exclude`` (there all three
  coincide), and ``--labels complete`` under ``simple`` / ``exact``.
- ``delta_y`` -- ΔY over the working sample (complete + administratively censored): Y when complete, 0 when
  censored. This is the pseudo-label whose conditional mean m_t = E[ΔY | H_t] the simple censored score elicits
  (Proposition C.3); the paper's WebShop numbers (§6.3, Appendix I.2 Tables 11, 13, 14) are computed with it.
  Default under ``--censoring simple``.
- ``soft`` -- the posterior success weight η̂ = ΔY + (1 − Δ) q̂_Z (Proposition C.2, Remark C.4): Y when complete,
  q̂_Z when censored, i.e. the labels the exact censored score (Eq. 4) is an expectation over. Default under
  ``--censoring exact``; with every q̂_Z = 0 it is ``delta_y``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from uqh.rundir.errors import UserError

LabelsOption = Literal["working", "complete"]
ConventionName = Literal["complete", "delta_y", "soft"]

LABEL_OPTIONS = ("working", "complete")
DEFAULT_LABELS = "working"


@dataclass(frozen=True)
class LabelConvention:
    name: ConventionName
    target: str  # the label formula, for table headers
    description: str  # one line, with the paper reference


LABEL_CONVENTIONS: dict[str, LabelConvention] = {
    c.name: c
    for c in (
        LabelConvention("complete", "Y (complete only)",
                        "Y of the complete trajectories only; censored ones are calibrated but never trained on"),
        LabelConvention("delta_y", "ΔY (working sample)",
                        "ΔY over the working sample: Y if complete, 0 if censored (pseudo-label of Prop. C.3, §6.3)"),
        LabelConvention("soft", "ΔY + (1−Δ)q̂_Z (working sample)",
                        "soft labels over the working sample: Y if complete, q̂_Z if censored (Prop. C.2, Remark C.4)"),
    )
}


def check_labels(option: str) -> str:
    if option not in LABEL_OPTIONS:
        raise UserError(f"unknown labels {option!r}; use one of {', '.join(LABEL_OPTIONS)}")
    return option


def label_convention(censoring: str, labels: str) -> ConventionName:
    """The convention in force for a censoring mode and a ``--labels`` option (``working`` or ``complete``)."""
    check_labels(labels)
    if censoring == "exclude" or labels == "complete":
        return "complete"
    return "soft" if censoring == "exact" else "delta_y"


def training_labels(y: np.ndarray, delta: np.ndarray, q_z: np.ndarray | None, convention: str) -> np.ndarray:
    """Per trajectory, the label the base rate and Platt are trained on under ``convention``; NaN = not a
    training trajectory (censored ones under ``complete``). ``q_z`` is read only for censored trajectories under
    ``soft``; ``y`` only for complete ones."""
    delta = np.asarray(delta, dtype=bool)
    y = np.asarray(y, dtype=float)
    if convention == "complete":
        out = np.where(delta, y, np.nan)
    elif convention == "delta_y":
        out = np.where(delta, y, 0.0)
    elif convention == "soft":
        if q_z is None:
            raise ValueError("soft labels need q_hat_z for the censored trajectories")
        out = np.where(delta, y, np.asarray(q_z, dtype=float))
        if np.any(~np.isfinite(out)):
            raise ValueError("soft labels need Y for every complete and a finite q_hat_z for every censored trajectory")
    else:
        raise ValueError(f"unknown label convention {convention!r}; use one of {', '.join(LABEL_CONVENTIONS)}")
    if np.any((out < 0) | (out > 1)):  # NaN compares False: only real values are checked
        raise ValueError("training labels must lie in [0, 1]")
    return out


def split_strata(y: np.ndarray, delta: np.ndarray, convention: str) -> tuple[np.ndarray, np.ndarray]:
    """(label, observed) to stratify the Platt split by (:func:`uqh.scoring.calibration.stratified_split`).

    ``complete``: Y of the complete trajectories, censored ones a third stratum. ``delta_y`` and ``soft``: the hard
    label ΔY, every trajectory observed -- censored ones join the complete failures (ordered by id together), so
    soft labels with every q̂_Z = 0 give exactly the ``delta_y`` split (*choice*, docs/scoring.md).
    """
    delta = np.asarray(delta, dtype=bool)
    y = np.asarray(y, dtype=float)
    if convention == "complete":
        return y, delta
    return np.where(delta, y, 0.0), np.ones(delta.shape, dtype=bool)
