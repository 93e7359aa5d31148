"""Scripted agents for the fake OpenAI server: each sample of each task answers as a plan says.

The request's ``seed`` is the episode's decoding seed (``derive_seed(run seed, '<task>#<k>')``), so the responder
knows which sample it is answering. Plan letters: ``R`` the right answer, ``W`` a wrong one, ``V`` another wrong
one, ``N`` no answer (the agent never finishes: the episode ends at the step budget, max_steps).
"""
from __future__ import annotations

import re

from uqh.harness.episode.loop import derive_seed, episode_id_for

DESIGN = [5, 5, 4, 3, 2, 1, 0, 5]  # right answers out of 5 per task
ARITH_PLAN = {f"arith-{i:04d}": ["R"] * c + ["W"] * (5 - c) for i, c in enumerate(DESIGN)}
ARITH_PLAN["arith-0006"] = ["W", "W", "N", "N", "N"]  # no right answer; the no-answer class is the mode


def four_tags(action: str, conf: str = "0.7") -> str:
    return f"<think>t</think>\n<action>{action}</action>\n<confidence>{conf}</confidence>\n<explanation>e</explanation>"


def sample_of(plan: dict[str, list[str]], run_seed: int = 42):
    """seed -> (task_id, sample_index) for every sample of the plan."""
    return {derive_seed(run_seed, episode_id_for(t, k)): (t, k) for t, acts in plan.items() for k in range(len(acts))}


def arithmetic_agent(plan: dict[str, list[str]], run_seed: int = 42):
    from uqh.domains.arithmetic import safe_eval

    who = sample_of(plan, run_seed)

    def responder(body: dict) -> str:
        task, k = who[body["seed"]]
        kind = plan[task][k]
        answer = int(safe_eval(re.search(r"What is (.*)\?", body["messages"][1]["content"]).group(1)))
        if kind == "N":
            return four_tags("Calc[1+1]", "0.3")
        value = {"R": answer, "W": answer + 1, "V": answer + 2}[kind]
        return four_tags(f"Finish[{value}]", "0.9" if kind == "R" else "0.6")

    return responder


def strategyqa_agent(plan: dict[str, list[str]], gold: dict[str, bool], run_seed: int = 42):
    """R answers the gold yes/no, W the other one, N never finishes."""
    who = sample_of(plan, run_seed)

    def responder(body: dict) -> str:
        task, k = who[body["seed"]]
        kind = plan[task][k]
        if kind == "N":
            return four_tags("Search[something]", "0.2")
        truth = gold[task] if kind == "R" else not gold[task]
        return four_tags("Finish[yes]" if truth else "Finish[no]", "0.8")

    return responder
