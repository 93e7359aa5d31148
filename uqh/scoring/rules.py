"""Binary scoring rules S(p, y), reward-oriented (higher is better).

Paper: §3 (beta family from the Schervish–Buja threshold mixture), Appendix J.1–J.2 (closed forms, boundary
behaviour). Every function is vectorised over ``p``; ``y`` may be 0/1 or a soft label in [0, 1]
(``y S(p,1) + (1-y) S(p,0)``, the form used by the exact censored score, Eq. 4 / Remark C.4).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from scipy.special import beta as beta_fn
from scipy.special import betainc

from uqh.rundir.errors import UserError

EPS = 1e-6  # Appendix J.2: probabilities are clipped to [EPS, 1-EPS] before any log score


@dataclass(frozen=True)
class ScoreRule:
    """A named member of the proper family: ``log``, ``brier`` or ``beta`` with parameters (alpha, beta)."""

    kind: str  # "log" | "brier" | "beta"
    alpha: float | None = None
    beta: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("log", "brier", "beta"):
            raise ValueError(f"unknown score kind {self.kind!r}")
        if self.kind == "beta" and not (self.alpha is not None and self.beta is not None and self.alpha > 0 and self.beta > 0):
            raise ValueError(f"beta family needs alpha, beta > 0, got ({self.alpha}, {self.beta})")

    @property
    def name(self) -> str:
        if self.kind == "beta":
            return f"beta({_fmt(self.alpha)},{_fmt(self.beta)})"
        return self.kind

    def pair(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(S(p, 1), S(p, 0))`` elementwise."""
        return self.branch(p, 1), self.branch(p, 0)

    def branch(self, p: np.ndarray, y: int) -> np.ndarray:
        """``S(p, y)`` for one fixed outcome y in {0, 1}, elementwise (§3, App. J.1):

        - log (the α=β→0 endpoint): ``S(p,1)=log p``, ``S(p,0)=log(1-p)``, p clipped to [1e-6, 1-1e-6] (App. J.2);
        - Brier, reported as ``-(p - y)^2`` (reward-oriented; ``S_{1,1}`` up to the factor 1/2);
        - Beta(α, β), through the regularised incomplete beta function I_x(a, b):
          ``S(p,1) = -∫_p^1 c^(α-1)(1-c)^β dc = -B(α, β+1) (1 - I_p(α, β+1))``,
          ``S(p,0) = -∫_0^p c^α (1-c)^(β-1) dc = -B(α+1, β) I_p(α+1, β)``; boundary floors (App. J.2)
          ``S(0,1) = -B(α, β+1)``, ``S(1,0) = -B(α+1, β)``.
        """
        if self.kind == "log":
            p = np.clip(np.asarray(p, dtype=float), EPS, 1.0 - EPS)
            return np.log(p) if y == 1 else np.log1p(-p)
        if self.kind == "brier":
            p = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
            return -((1.0 - p) ** 2) if y == 1 else -(p**2)
        a, b = self.alpha, self.beta
        p = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
        if y == 1:  # 1 - I_p(a, b+1) = I_{1-p}(b+1, a): better precision near p -> 1
            return -beta_fn(a, b + 1.0) * betainc(b + 1.0, a, 1.0 - p)
        return -beta_fn(a + 1.0, b) * betainc(a + 1.0, b, p)

    def observed(self, p: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``S(p, y)`` for hard labels y in {0, 1}, evaluating only the branch each element needs."""
        p = np.asarray(p, dtype=float)
        y = np.asarray(y)
        out = np.empty(p.shape)
        one = y == 1
        zero = ~one
        out[one] = self.branch(p[one], 1)
        out[zero] = self.branch(p[zero], 0)
        return out

    def __call__(self, p: np.ndarray, y: np.ndarray) -> np.ndarray:
        s1, s0 = self.pair(p)
        y = np.asarray(y, dtype=float)
        return y * s1 + (1.0 - y) * s0


def _fmt(x: float | None) -> str:
    return f"{x:g}"


_BETA_RE = re.compile(r"^beta[:(]\s*([0-9.eE+-]+)\s*,\s*([0-9.eE+-]+)\s*\)?$")


def parse_score(spec: str) -> ScoreRule:
    """Parse ``log``, ``brier``, ``beta:A,B`` (or ``beta(A,B)``) into a :class:`ScoreRule`."""
    s = spec.strip().lower()
    if s in ("log", "brier"):
        return ScoreRule(s)
    m = _BETA_RE.match(s)
    if m:
        try:
            a, b = float(m.group(1)), float(m.group(2))
        except ValueError:
            a = b = -1.0
        if a > 0 and b > 0 and np.isfinite(a) and np.isfinite(b):
            return ScoreRule("beta", a, b)
    raise UserError(f"unknown score {spec!r}; use log, brier or beta:A,B with A, B > 0 (e.g. beta:2,4)")


DEFAULT_SCORES = ("log", "brier", "beta:2,4")
