"""An agent of the plugin's own: the paper's ReAct loop with one more instruction in its system prompt."""
from __future__ import annotations

from uqh.harness.episode.react_agent import ReactAgent

BRIEF = "Keep every <think> to one sentence."


class BriefAgent(ReactAgent):
    name = "brief"
    description = "the ReAct loop, told to keep its reasoning to one sentence"

    @classmethod
    def system_prompt_for(cls, domain) -> str:
        return domain.system_prompt().rstrip("\n") + "\n" + BRIEF + "\n"
