"""The guess domain: the agent guesses a number between 1 and 100 and is told "Higher." or "Lower."."""
from __future__ import annotations

import re

from pydantic import Field

from uqh.domains.base import Domain, DomainOptions, EnvResponse, Environment, InvalidAction, clean_final_action

GUESS = re.compile(r"Guess\[(\d+)\]")


class GuessOptions(DomainOptions):
    n_tasks: int = Field(20, ge=1, description="how many numbers to guess")


class GuessEnv(Environment):
    def __init__(self, secret: int):
        self.secret = secret

    async def reset(self) -> str:
        return "Guess my number between 1 and 100. Actions: Guess[n]."

    async def step(self, action: str) -> EnvResponse:
        m = GUESS.fullmatch(action.strip())
        if not m:
            raise InvalidAction("use Guess[n] with a whole number n")
        n = int(m.group(1))
        if n == self.secret:
            return EnvResponse("Correct.", done=True, outcome=1, reward=1.0)
        return EnvResponse("Higher." if n < self.secret else "Lower.")


class GuessDomain(Domain):
    prompt_file = "guess.txt"  # beside this module
    display_name = "Guess-the-number"
    default_step_budget = 7
    action_gbnf = '"Guess[" [0-9] [0-9]? "]"'
    Options = GuessOptions

    def all_task_ids(self) -> list[str]:
        return [f"guess-{i}" for i in range(self.settings.n_tasks)]

    def make_env(self, task_id: str, *, episode_seed: int) -> Environment:
        return GuessEnv(secret=1 + int(task_id.split("-")[1]) * 37 % 100)

    @classmethod
    def canonical_answer(cls, episode) -> str | None:
        action = clean_final_action(episode)
        m = GUESS.fullmatch(action.strip()) if action else None
        return m.group(1) if m else None
