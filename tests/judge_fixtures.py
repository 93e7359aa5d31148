"""Scripted agents and judges for the `uqh judge` tests, served by the fake OpenAI-compatible server.

- :func:`agent` plays arithmetic: by the question's hash it answers correctly (confidence rising), answers
  wrongly (confidence dropping at the final step), or keeps calculating until the budget runs out (max_steps).
- :func:`judge` answers as a GPA judge with valid JSON: GF scores 3 when the final answer equals the last
  calculator result and 0 otherwise (so GF separates failures perfectly); the other judges score around that,
  one point lower on some seeds (so repeats disagree a little); every judge cites the last step.
"""
from __future__ import annotations

import hashlib
import json
import re

from uqh.rundir.judgments import JudgeMetric

LABEL_TO_CODE = {m.label.upper(): m.value for m in JudgeMetric}


def _mode(question: str) -> int:
    return int(hashlib.sha256(question.encode()).hexdigest(), 16) % 4


def step(action: str, conf: float) -> str:
    return f"<think>plan: {action}</think><action>{action}</action><confidence>{conf}</confidence>" \
           "<explanation>e</explanation>"


def agent(body: dict) -> str:
    msgs = body["messages"]
    question = re.search(r"What is (.*)\?", msgs[1]["content"]).group(1)
    mode = _mode(question)
    if not any(m["role"] == "assistant" for m in msgs) or mode == 1:
        return step(f"Calc[{question}]", 0.7)
    value = msgs[-1]["content"].split()[-1]
    if mode == 0:
        return step(f"Finish[{value}1]", 0.4)  # wrong, and the confidence drops at this step
    return step(f"Finish[{value}]", 0.9)


def judged_metric(body: dict) -> str:
    system = body["messages"][0]["content"]
    return next(code for label, code in LABEL_TO_CODE.items() if f"{label} judge" in system)


def trace_facts(body: dict) -> tuple[int, bool]:
    """(steps in the trace, whether the final answer equals the last calculator result)."""
    user = body["messages"][1]["content"]
    n = len(re.findall(r"^\[step \d+\]$", user, flags=re.M))
    results = re.findall(r"OBSERVATION: Result: (\S+)", user)
    final = re.findall(r"ACTION: Finish\[(\S+)\]", user)
    return n, bool(final and results and final[-1] == results[-1])


def judge_reply(body: dict) -> dict:
    n, correct = trace_facts(body)
    metric = judged_metric(body)
    if metric == "GF":
        score = 3 if correct else 0
    else:
        score = 3 if correct else 1
        if body.get("seed", 0) % 3 == 0:
            score = max(0, score - 1)
    return {"score": score, "rationale": f"{metric}: checked every step", "cited_steps": [n] if n else []}


def judge(body: dict) -> str:
    return json.dumps(judge_reply(body))


def is_repair(body: dict) -> bool:
    return len(body["messages"]) > 2 and "could not be used" in body["messages"][-1]["content"]
