"""An oracle domain: a Pólya urn whose true success probability q_t is known in closed form at every step.

Task ``urn-0042`` fixes, from the sha256 of its id, an urn that starts with ``a`` red and ``b`` white balls
(1 ≤ a, b ≤ 3), a number of draws ``N`` (the ``n_draws`` option, default 5) and a target ``k`` (1 ≤ k ≤ N).
Each drawn ball is put back with one more ball of its colour (a Pólya urn). The task succeeds (Y = 1) iff at
least ``k`` of the ``N`` draws are red. The draw sequence is fixed by the task id before the episode starts.

The agent acts with ``Draw[]`` (see the next ball) or ``Stop[]`` (end now: the remaining balls are drawn and
shown). Whatever it does, Y is a function of the hidden sequence alone, and its actions only choose how much of
the sequence it has seen; a decision to stop is itself a function of what was seen. So the truthful process
``q_t = P(Y = 1 | H_t)`` depends on the history only through (a, b, N, k) and the counts of red and white balls
seen, not on the agent's policy: it is the beta-binomial tail :func:`success_probability`. Every step records
``info["q_t"]``: q for the history on which that step's confidence was stated (before its action's observation),
so ``uqh score`` can show the truth as a reference predictor. See ``docs/oracle-domain.md``.
"""
from __future__ import annotations

import hashlib
import random
from fractions import Fraction
from math import comb

from uqh.domains.base import Domain, DomainOptions, EnvResponse, Environment, InvalidAction, PositiveInt, option_field
from uqh.domains.domain_registry import register_domain
from uqh.domains.tool_offer import BracketTool
from uqh.rundir.schema import Episode

N_TASKS = 1000
MAX_INITIAL_BALLS = 3
#: The key of ``Step.info`` that holds q_t (read by the ``truth`` predictor of uqh.scoring.registry).
Q_T_KEY = "q_t"


def rising(x: int, n: int) -> int:
    """The rising factorial x (x+1) ... (x+n-1) (1 for n = 0)."""
    out = 1
    for i in range(n):
        out *= x + i
    return out


def success_probability_exact(a: int, b: int, n_draws: int, target: int, red: int, white: int) -> Fraction:
    """P(at least ``target`` red among ``n_draws`` | ``red`` red and ``white`` white seen) for a Pólya urn that
    started with ``a`` red and ``b`` white balls, as an exact fraction.

    The remaining m = N - red - white draws have a red count R ~ BetaBinomial(m, a + red, b + white) (the
    posterior predictive of a Beta(a, b) prior updated by the counts seen), so
    q = Σ_{x ≥ target - red} C(m, x) (a+red)^(x) (b+white)^(m-x) / (a+b+red+white)^(m) with rising factorials.
    """
    m = n_draws - red - white
    if m < 0 or min(a, b, red, white) < 0:
        raise ValueError("counts must be non-negative and at most n_draws")
    need = target - red
    if need <= 0:
        return Fraction(1)
    if need > m:
        return Fraction(0)
    ra, rb = a + red, b + white
    total = sum(comb(m, x) * rising(ra, x) * rising(rb, m - x) for x in range(need, m + 1))
    return Fraction(total, rising(ra + rb, m))


def success_probability(a: int, b: int, n_draws: int, target: int, red: int, white: int) -> float:
    """:func:`success_probability_exact` as a float: the q_t recorded in every step."""
    return float(success_probability_exact(a, b, n_draws, target, red, white))


def task_parameters(task_id: str, n_draws: int) -> tuple[int, int, int]:
    """(a, b, k) of a task: initial red and white balls and the target number of red draws."""
    h = hashlib.sha256(task_id.encode()).digest()
    return 1 + h[0] % MAX_INITIAL_BALLS, 1 + h[1] % MAX_INITIAL_BALLS, 1 + h[2] % n_draws


def hidden_draws(task_id: str, a: int, b: int, n_draws: int) -> list[bool]:
    """The task's fixed draw sequence (True: red), sampled from the Pólya urn with a seed from the task id."""
    rng = random.Random(int.from_bytes(hashlib.sha256(b"draws:" + task_id.encode()).digest()[:8], "big"))
    red, white, out = a, b, []
    for _ in range(n_draws):
        is_red = rng.random() < red / (red + white)
        out.append(is_red)
        red, white = red + is_red, white + (not is_red)
    return out


def _colours(draws: list[bool]) -> str:
    return ", ".join("red" if d else "white" for d in draws)


class UrnOptions(DomainOptions):
    n_draws: PositiveInt = option_field(5, description="how many balls are drawn in every task (N)")
    n_tasks: PositiveInt = option_field(N_TASKS, description="how many tasks the domain lists")


class UrnEnv(Environment):
    def __init__(self, task_id: str, n_draws: int):
        self.a, self.b, self.k = task_parameters(task_id, n_draws)
        self.n_draws = n_draws
        self.draws = hidden_draws(task_id, self.a, self.b, n_draws)
        self.seen = 0
        self.done = False

    def q(self) -> float:
        red = sum(self.draws[: self.seen])
        return success_probability(self.a, self.b, self.n_draws, self.k, red, self.seen - red)

    async def reset(self) -> str:
        self.seen, self.done = 0, False
        return (f"The urn holds {self.a} red and {self.b} white balls. {self.n_draws} balls will be drawn one at a "
                f"time; each drawn ball is put back together with one more ball of the same colour. The task "
                f"succeeds if at least {self.k} of the {self.n_draws} draws are red. No ball has been drawn yet.")

    async def step(self, action: str) -> EnvResponse:
        if self.done:
            raise InvalidAction("the episode has already finished")
        action = action.strip()
        if action not in ("Draw[]", "Stop[]"):
            raise InvalidAction("the action must be exactly Draw[] or Stop[]")
        info = {Q_T_KEY: self.q()}
        if action == "Draw[]":
            self.seen += 1
            red = sum(self.draws[: self.seen])
            text = (f"Draw {self.seen} of {self.n_draws}: {'red' if self.draws[self.seen - 1] else 'white'}. "
                    f"So far {red} red and {self.seen - red} white.")
            if self.seen < self.n_draws:
                return EnvResponse(observation=text, info=info)
        else:
            rest = self.draws[self.seen:]
            text = f"You stopped. The remaining draws were: {_colours(rest) if rest else 'none'}."
        self.done = True
        red = sum(self.draws)
        success = red >= self.k
        return EnvResponse(
            observation=f"{text} All {self.n_draws} draws: {red} red. The task "
                        f"{'succeeded' if success else 'failed'} (needed {self.k} red).",
            done=True, outcome=int(success), reward=float(success),
            reward_info={"red": red, "target": self.k, "initial_red": self.a, "initial_white": self.b},
            info=info,
        )


@register_domain("urn")
class UrnDomain(Domain):
    prompt_file = "urn.txt"
    display_name = "Urn"
    default_step_budget = 6
    action_gbnf = '"Draw[]" | "Stop[]"'
    default_observation_chars = None
    Options = UrnOptions
    bracket_tools = (
        BracketTool("Draw", "draw", "See the colour of the next ball."),
        BracketTool("Stop", "stop", "End the episode now; the remaining balls are drawn and shown."),
    )
    tool_instructions = ("You are an agent watching balls drawn from an urn. A task succeeds or fails depending only "
                         "on the colours drawn. Use the draw tool to see the next ball, or the stop tool to end the "
                         "episode now.")

    def all_task_ids(self) -> list[str]:
        return [f"urn-{i:04d}" for i in range(self.settings.n_tasks)]

    def make_env(self, task_id: str, *, episode_seed: int) -> Environment:
        return UrnEnv(task_id, self.settings.n_draws)

    @classmethod
    def canonical_answer(cls, episode: Episode) -> str | None:
        """Always the "no answer" class: the agent only decides when to stop looking, the urn decides Y, so there
        is no final answer for self-consistency to agree on (``uqh certify`` on urn runs reports no agreement)."""
        return None

    def manifest_info(self) -> dict:
        return {"generator": "sha256(task_id) -> Pólya urn (a, b), target k, draw sequence",
                "truth": f"Step.info[{Q_T_KEY!r}] = P(Y=1 | H_t) (beta-binomial tail)"}
