"""StrategyQA (Geva et al., 2021): yes/no questions over a Wikipedia-style corpus, Search / Lookup / Finish.

Paper settings (Appendix K, Table 16): the full ``wics/strategy-qa`` split (2,290 questions, file order), step
budget 16, top-k 3, observations cut to 420 characters.
"""
from __future__ import annotations

from typing import Any

from uqh.rundir.errors import UserError
from uqh.rundir.schema import Episode

from uqh.domains.domain_registry import register_domain
from uqh.domains.base import EnvResponse, InvalidAction, PositiveInt, option_field
from uqh.domains.qa.qa_base import QADomain, QAOptions, QATask, warn_once
from uqh.domains.tool_offer import BracketTool
from uqh.domains.qa.retrieval import Paragraph, dedupe

FALLBACK_CORPUS_LABEL = "fallback-facts"


def fallback_corpus(tasks: list[QATask]) -> list[Paragraph]:
    """The documented offline fallback: one paragraph per term description and one per fact, titled by the term."""
    out: list[Paragraph] = []
    for t in tasks:
        term = str(t.row.get("term") or "").strip()
        desc = str(t.row.get("description") or "").strip()
        if term and desc:
            out.append(Paragraph(title=term, text=f"{term}: {desc}."))
        for fact in t.row.get("facts") or []:
            fact = " ".join(str(fact).split())
            if fact:
                out.append(Paragraph(title=term or t.task_id, text=fact))
    return dedupe(out)


def parse_yes_no(answer: str) -> bool:
    """``yes``/``no`` (case, surrounding spaces, quotes and a final period ignored); anything else is invalid."""
    norm = answer.strip().strip("\"'`").strip().rstrip(".!").strip().lower()
    if norm == "yes":
        return True
    if norm == "no":
        return False
    raise InvalidAction(f"the StrategyQA answer must be exactly yes or no, got {answer[:60]!r}; use Finish[yes] or Finish[no]")


class StrategyQAOptions(QAOptions):
    top_k: PositiveInt = option_field(3, description="passages a Search returns (Table 16: 3)", flag="--top-k")


@register_domain("strategyqa")
class StrategyQADomain(QADomain):
    prompt_file = "strategyqa.txt"
    display_name = "StrategyQA"
    default_step_budget = 16
    action_gbnf = '("Search[" | "Lookup[") [^\\]<\\n]{1,120} "]" | "Finish[yes]" | "Finish[no]"'
    default_split = "test"
    splits = ("train", "test")
    Options = StrategyQAOptions
    hub_name = "wics/strategy-qa"
    hub_config = None
    data_subdir = "strategyqa"
    bracket_tools = (*QADomain.bracket_tools[:2],
                     BracketTool("Finish", "finish", "End the episode with your final answer: yes or no.", "answer",
                                 "exactly yes or no"))
    preferred_files = ("strategyQA_train.json", "strategyqa_train.json", "strategyqa.jsonl")
    finish_hint = "Finish[yes] / Finish[no]"

    def rows_to_tasks(self, rows: list[dict[str, Any]]) -> list[QATask]:
        tasks = []
        for i, row in enumerate(rows):
            missing = [k for k in ("qid", "question", "answer") if row.get(k) is None]
            if missing:
                raise UserError(f"strategyqa row {i} lacks {', '.join(missing)}; the data must have qid, question, answer")
            answer = row["answer"]
            if not isinstance(answer, bool):
                raise UserError(f"strategyqa row {i} ({row['qid']}): answer must be a JSON boolean, got {answer!r}")
            tasks.append(QATask(task_id=str(row["qid"]), question=str(row["question"]), answer=answer, row=row))
        return tasks

    def default_corpus(self) -> tuple[list[Paragraph], str]:
        warn_once(
            "strategyqa-fallback",
            "strategyqa: no --corpus given; using the fallback corpus built from the questions' facts and term "
            "descriptions (recorded as corpus: fallback-facts). Pass --corpus FILE with Wikipedia paragraphs for real runs.",
        )
        return fallback_corpus(list(self.tasks.values())), FALLBACK_CORPUS_LABEL

    def finish(self, task: QATask, answer: str) -> EnvResponse:
        predicted = parse_yes_no(answer)
        outcome = int(predicted == task.answer)
        word = "yes" if predicted else "no"
        return EnvResponse(
            observation=f"Episode finished with answer: {word}.",
            done=True,
            outcome=outcome,
            reward=float(outcome),
            reward_info={"answer": word, "gold": task.answer, "correct": bool(outcome)},
        )

    @classmethod
    def canonical_answer(cls, episode: Episode) -> str | None:
        """``yes`` or ``no`` (``Finish[Yes.]`` → ``yes``)."""
        answer = cls.finish_argument(episode)
        if answer is None:
            return None
        try:
            return "yes" if parse_yes_no(answer) else "no"
        except InvalidAction:
            return None
