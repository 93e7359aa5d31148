"""When a censored prefix has enough continuation branches: the stop rules of ``uqh continue --stop-rule``.

- ``fixed``: every prefix gets ``--branches`` M branches, in one batch (the paper's design, Appendix H.2).
- ``ci:H``: branches run in rounds (cumulative branch counts :data:`ROUNDS`, capped at M); after each round a
  prefix stops once the 95% confidence sequence for its ``q_Z`` has half-width <= H, else at M.

The interval is a *confidence sequence* (valid at every sample size at once, so at a data-dependent stopping
round too): Robbins' beta-binomial mixture. For the outcomes ``y_1..y_n`` of a prefix's resolved branches (in
branch-index order; unresolved and parse-error branches carry no outcome and are skipped) with ``s`` successes,

    M_n(p) = B(a + s, b + n - s) / B(a, b) / (p^s (1 - p)^(n - s))

is the likelihood ratio of the Beta(a, b) mixture against ``p``: a nonnegative martingale with mean 1 when
``q_Z = p``, so by Ville's inequality ``P(exists n: M_n(q_Z) >= 1/alpha) <= alpha`` and
``CS_n = {p : M_n(p) < 1/alpha}`` covers ``q_Z`` at every ``n`` simultaneously with probability >= 1 - alpha
(Robbins 1970, "Statistical methods related to the law of the iterated logarithm", Ann. Math. Statist. 41;
Howard, Ramdas, McAuliffe & Sekhon 2021, "Time-uniform, nonparametric, nonasymptotic confidence sequences",
Ann. Statist. 49, Sec. 3 and Prop. 6 on conjugate mixtures). The prior is Jeffreys' Beta(1/2, 1/2).
``log M_n(p)`` is convex in ``p`` and at most 0 at ``p = s/n`` (a mixture of likelihoods never exceeds the
maximum), so ``CS_n`` is an interval containing ``s/n``; its ends are found by bisection.

What the interval costs: no valid interval can be narrow from few draws. After n outcomes that all agree, any
procedure with 95% coverage at every q must reach ``1 - 0.05**(1/n)`` (0.26 at n = 10); this sequence reaches
0.38 (half-width 0.19) at n = 10, so a target ``H = 0.1`` never stops a prefix before M = 10 -- see
docs/continuation.md and benchmarks/results/qz_cost.md for the measured trade-off.

Pure and deterministic (math only): the harness takes the decisions while it runs (this module), records them in
``stop_decisions.jsonl`` (:class:`uqh.rundir.schema.StopDecision`), and scoring only reads that record.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from uqh.rundir.errors import UserError
from uqh.rundir.schema import Episode, StopDecision, StopReason

#: Confidence level of the interval a ``ci:H`` rule stops on.
LEVEL = 0.95
#: Beta prior of the mixture (Jeffreys).
PRIOR = (0.5, 0.5)
#: Cumulative branches per prefix after each round of a sequential rule (capped at ``--branches``; rounds above
#: the cap are dropped and the cap is the last round). The first round of one branch writes every prefix's
#: conversation into the provider's prompt cache before its other branches are sent (they would all miss it if
#: sent at once); no prefix can stop on one outcome, so it costs one round of latency and no branches.
ROUNDS = (1, 5)
#: Branches added per round after :data:`ROUNDS`.
ROUND_STEP = 1

_BISECTION_STEPS = 200  # the interval's ends to within float resolution


# ------------------------------------------------------------------------------------------ the interval


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def log_mixture_ratio(p: float, successes: int, n: int, prior: tuple[float, float] = PRIOR) -> float:
    """``log M_n(p)``: the beta-binomial mixture's log likelihood ratio against ``p`` (see the module docstring)."""
    a, b = prior
    s, f = successes, n - successes
    if (p <= 0.0 and s > 0) or (p >= 1.0 and f > 0):
        return math.inf
    log_lik = (s * math.log(p) if s else 0.0) + (f * math.log1p(-p) if f else 0.0)
    return _log_beta(a + s, b + f) - _log_beta(a, b) - log_lik


@lru_cache(maxsize=4096)
def confidence_sequence(
    successes: int, n: int, *, level: float = LEVEL, prior: tuple[float, float] = PRIOR
) -> tuple[float, float]:
    """The level-``level`` beta-binomial confidence sequence for a Bernoulli mean after ``successes`` of ``n``:
    ``{p : M_n(p) < 1 / (1 - level)}`` as ``(lower, upper)``; ``(0, 1)`` when ``n = 0``."""
    if not (0 <= successes <= n):
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n == 0:
        return 0.0, 1.0
    threshold = -math.log1p(-level)  # log(1/alpha)
    centre = successes / n
    s, f = successes, n - successes
    log_marginal = _log_beta(prior[0] + s, prior[1] + f) - _log_beta(*prior)

    def outside(p: float) -> bool:  # log M_n(p) >= log(1/alpha), for 0 < p < 1
        return log_marginal - s * math.log(p) - f * math.log1p(-p) >= threshold

    def edge(inside: float, out: float) -> float:
        for _ in range(_BISECTION_STEPS):
            mid = 0.5 * (inside + out)
            if mid in (inside, out):
                break
            if outside(mid):
                out = mid
            else:
                inside = mid
        return inside

    lower = 0.0 if successes == 0 else edge(centre, 0.0)
    upper = 1.0 if successes == n else edge(centre, 1.0)
    return lower, upper


# ------------------------------------------------------------------------------------------ rules


@dataclass(frozen=True)
class StopRule:
    """A parsed ``--stop-rule``: ``fixed`` (``half_width`` None) or ``ci:H``."""

    half_width: float | None = None
    level: float = LEVEL

    @property
    def is_fixed(self) -> bool:
        return self.half_width is None

    @property
    def text(self) -> str:
        """The canonical spelling (what the continuation config and ``qz.jsonl`` record)."""
        return "fixed" if self.half_width is None else f"ci:{self.half_width:g}"

    def rounds(self, max_branches: int) -> list[int]:
        """Cumulative branches per prefix after each round, ending at ``max_branches``.

        The rounds below ``max_branches`` are the same for every larger maximum, so a run resumed with a larger
        ``--branches`` takes the same decisions up to the old maximum (:func:`uqh.harness.continuation.check_resume`).
        """
        if max_branches < 1:
            raise ValueError("max_branches must be at least 1")
        if self.is_fixed:
            return [max_branches]
        targets = list(ROUNDS)
        while targets[-1] < max_branches:
            targets.append(targets[-1] + ROUND_STEP)
        return sorted({min(t, max_branches) for t in targets})


FIXED = StopRule()


def parse_stop_rule(text: str) -> StopRule:
    """``fixed`` or ``ci:H`` (0 < H < 0.5, the target half-width of the 95% interval); UserError otherwise."""
    spec = (text or "").strip().lower()
    if spec == "fixed":
        return FIXED
    if spec.startswith("ci:"):
        try:
            h = float(spec[3:])
        except ValueError:
            h = math.nan
        if 0.0 < h < 0.5:
            return StopRule(half_width=h)
        raise UserError(f"--stop-rule {text}: the half-width H of ci:H must be a number in (0, 0.5), e.g. ci:0.2")
    raise UserError(f"unknown --stop-rule {text!r}; use fixed or ci:H (stop a prefix once its 95% interval for q_Z "
                    "has half-width <= H), e.g. ci:0.2")


# ------------------------------------------------------------------------------------------ decisions


def resolved_outcome(branch: Episode) -> int | None:
    """The outcome a branch contributes to the interval: Y of a ``clean`` branch, else None (unresolved,
    parse-error and other endings carry no outcome -- the primary q_Z route of Appendix H excludes them too)."""
    return branch.outcome if branch.stop_reason == StopReason.clean else None


def decide(
    rule: StopRule, episode_id: str, outcomes: Sequence[int | None], *, planned: int, max_branches: int
) -> StopDecision:
    """The state of one prefix after a round that planned its first ``planned`` branches.

    ``outcomes``: :func:`resolved_outcome` of branches ``0 .. planned-1`` that finished, in branch-index order
    (``len(outcomes) < planned`` when some did not finish: then the decision stays open, ``stopped_by`` None,
    so that a resumed run decides on exactly the same outcomes).
    """
    ys = [y for y in outcomes if y is not None]
    n, s = len(ys), int(sum(ys))
    lo, hi = confidence_sequence(s, n, level=rule.level)
    stopped_by = None
    if len(outcomes) >= planned:
        if not rule.is_fixed and (hi - lo) / 2.0 <= rule.half_width:
            stopped_by = "half_width"
        elif planned >= max_branches:
            stopped_by = "max_branches"
    return StopDecision(
        episode_id=episode_id, stop_rule=rule.text, branches=len(outcomes), resolved=n, successes=s,
        interval=(lo, hi), stopped_by=stopped_by,
    )
