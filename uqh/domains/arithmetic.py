"""A tiny built-in domain for tests and offline demos: deterministic arithmetic questions.

Task ``arith-0042`` is generated from the sha256 of its id: ``What is (a op b) op c?`` with small integers.
Tools: ``Calc[expression]`` (a safe evaluator over numbers, + - * / // % ** and parentheses; no ``eval``) and
``Finish[number]`` (terminal: outcome 1 if the number equals the exact answer). Anything else is an
``InvalidAction`` (repairable). Deterministic, so the default replay (re-execute and compare) works.
"""
from __future__ import annotations

import ast
import hashlib
import math
import operator
import re

from uqh.domains.domain_registry import register_domain
from uqh.domains.base import Domain, EnvResponse, Environment, InvalidAction, clean_final_action
from uqh.domains.tool_offer import BracketTool
from uqh.rundir.schema import Episode

N_TASKS = 1000
_ACTION = re.compile(r"^(Calc|Finish)\[(.*)\]$", re.DOTALL)
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPR_CHARS = 200
_MAX_MAGNITUDE = 1e15


class CalcError(ValueError):
    pass


def safe_eval(expression: str) -> float | int:
    """Evaluate an arithmetic expression without ``eval``: numbers, + - * / // % **, unary +/-, parentheses."""
    expression = expression.strip()
    if not expression:
        raise CalcError("empty expression")
    if len(expression) > _MAX_EXPR_CHARS:
        raise CalcError(f"expression longer than {_MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
    except SyntaxError:
        raise CalcError(f"cannot parse {expression!r}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise CalcError("exponent too large")
        try:
            value = _OPS[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        if isinstance(value, complex) or not math.isfinite(value) or abs(value) > _MAX_MAGNITUDE:
            raise CalcError("result out of range")
        return value
    raise CalcError("only numbers, + - * / // % ** and parentheses are allowed")


def format_number(value: float | int) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.10g}"
    return str(value)


def make_question(task_id: str) -> tuple[str, int]:
    """(question text, exact integer answer) for a task id."""
    h = hashlib.sha256(task_id.encode()).digest()
    a, b, c = 2 + h[0] % 48, 2 + h[1] % 48, 2 + h[2] % 12
    op1, op2 = "+-*"[h[3] % 3], "+-*"[h[4] % 3]
    expr = f"({a} {op1} {b}) {op2} {c}"
    answer = int(safe_eval(expr))
    return f"What is {expr}?", answer


class ArithmeticEnv(Environment):
    def __init__(self, task_id: str, truncate):
        self.task_id = task_id
        self.question, self.answer = make_question(task_id)
        self._truncate = truncate
        self.done = False

    async def reset(self) -> str:
        self.done = False
        return f"Question: {self.question}"

    async def step(self, action: str) -> EnvResponse:
        if self.done:
            raise InvalidAction("the episode has already finished")
        m = _ACTION.match(action.strip())
        if not m:
            raise InvalidAction("the action must be exactly Calc[expression] or Finish[number]")
        tool, arg = m.group(1), m.group(2).strip()
        if tool == "Calc":
            try:
                obs = f"Result: {format_number(safe_eval(arg))}"
            except CalcError as exc:
                obs = f"Calc error: {exc}"
            return EnvResponse(observation=self._truncate(obs))
        try:
            given = float(arg.replace(",", ""))
        except ValueError:
            raise InvalidAction(f"Finish needs a single number, got {arg[:40]!r}") from None
        correct = math.isfinite(given) and abs(given - self.answer) < 1e-9
        self.done = True
        return EnvResponse(
            observation=f"Episode finished. Your answer {format_number(given)} is {'correct' if correct else 'wrong'}.",
            done=True,
            outcome=int(correct),
            reward=float(correct),
            reward_info={"answer": self.answer, "given": given},
        )


@register_domain("arithmetic")
class ArithmeticDomain(Domain):
    prompt_file = "arithmetic.txt"
    display_name = "Arithmetic"
    default_step_budget = 6
    action_gbnf = '"Calc[" [0-9+*/(). -]{1,60} "]" | "Finish[" "-"? [0-9]{1,12} "]"'
    default_split = None
    splits = ()  # generated tasks: there is no split to choose
    supports_replay = True
    bracket_tools = (
        BracketTool("Calc", "calc", "Evaluate an arithmetic expression (numbers, + - * / // % **, parentheses) and "
                    "return the result.", "expression", "the expression to evaluate"),
        BracketTool("Finish", "finish", "End the episode with your final numeric answer.", "answer",
                    "the final answer: a single number"),
    )
    tool_instructions = ("You are an arithmetic agent. You answer arithmetic questions with an exact number. Use the "
                         "calc tool to compute, and the finish tool to give your final answer, a single number.")

    def all_task_ids(self) -> list[str]:
        return [f"arith-{i:04d}" for i in range(N_TASKS)]

    def make_env(self, task_id: str, *, episode_seed: int) -> Environment:
        return ArithmeticEnv(task_id, self.truncate)

    def manifest_info(self) -> dict:
        return {"generator": "sha256(task_id) -> (a op b) op c"}

    @classmethod
    def canonical_answer(cls, episode: Episode) -> str | None:
        """The number of ``Finish[number]`` in standard decimal form (``42``, ``42.0`` and ``42.000`` → ``42``;
        ``1,000`` → ``1000``)."""
        action = clean_final_action(episode)
        m = _ACTION.match(action.strip()) if action is not None else None
        if m is None or m.group(1) != "Finish":
            return None
        try:
            value = float(m.group(2).strip().replace(",", ""))
        except ValueError:
            return None
        return format_number(value) if math.isfinite(value) else None
