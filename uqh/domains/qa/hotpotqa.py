"""HotpotQA (Yang et al., 2018): multi-hop questions, Search / Lookup / Finish[free text].

Paper settings (Appendix K, Table 16): a 2,000-question sample (seed 42) of the ``fullwiki`` validation split,
step budget 7, top-k 5, observations cut to 420 characters. Outcome Y = exact match after SQuAD normalisation;
F1 is recorded in ``reward_info``.
"""
from __future__ import annotations

import random
import re
import string
from collections import Counter
from typing import Any

from uqh.rundir.errors import UserError
from uqh.rundir.schema import Episode

from uqh.domains.domain_registry import register_domain
from uqh.domains.base import EnvResponse, InvalidAction, PositiveInt, option_field
from uqh.domains.qa.qa_base import QADomain, QAOptions, QATask
from uqh.domains.qa.retrieval import Paragraph, dedupe

CONTEXT_CORPUS_LABEL = "hotpotqa-context-union"

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD / HotpotQA normalisation: lower-case, drop punctuation, drop articles, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> int:
    return int(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 as in the official HotpotQA evaluation (yes/no/noanswer must match exactly)."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    special = ("yes", "no", "noanswer")
    if (pred in special or ref in special) and pred != ref:
        return 0.0
    pred_toks, ref_toks = pred.split(), ref.split()
    common = Counter(pred_toks) & Counter(ref_toks)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_toks), same / len(ref_toks)
    return 2 * precision * recall / (precision + recall)


def context_paragraphs(rows: list[dict[str, Any]]) -> list[Paragraph]:
    """The union of the rows' context paragraphs (HF ``hotpot_qa`` schema: context{title[], sentences[][]})."""
    out = []
    for row in rows:
        ctx = row.get("context") or {}
        titles, sents = ctx.get("title") or [], ctx.get("sentences") or []
        for title, sentences in zip(titles, sents):
            text = " ".join(" ".join(str(s).strip() for s in sentences).split())
            out.append(Paragraph(title=str(title), text=text))
    return dedupe(out)


class HotpotQAOptions(QAOptions):
    top_k: PositiveInt = option_field(5, description="passages a Search returns (Table 16: 5)", flag="--top-k")


@register_domain("hotpotqa")
class HotpotQADomain(QADomain):
    prompt_file = "hotpotqa.txt"
    display_name = "HotpotQA"
    default_step_budget = 7
    action_gbnf = '("Search[" | "Lookup[" | "Finish[") [^\\]<\\n]{1,120} "]"'
    default_split = "validation"
    splits = ("train", "validation", "test")
    Options = HotpotQAOptions
    hub_name = "hotpotqa/hotpot_qa"
    hub_config = "fullwiki"
    data_subdir = "hotpotqa"
    preferred_files = ("hotpotqa_distractor_dev_sample100.jsonl", "hotpot_dev_v1_simplified.json")
    finish_hint = "Finish[answer]"

    def rows_to_tasks(self, rows: list[dict[str, Any]]) -> list[QATask]:
        self._rows = rows
        tasks = []
        for i, row in enumerate(rows):
            if row.get("question") is None or row.get("answer") is None:
                raise UserError(f"hotpotqa row {i} lacks question or answer; the data must have question and answer")
            task_id = str(row["id"]) if row.get("id") else f"dev-{i:05d}"  # the simplified file has no ids
            tasks.append(QATask(task_id=task_id, question=str(row["question"]), answer=str(row["answer"]), row=row))
        return tasks

    def select_task_ids(self, n: int | None, seed: int) -> list[str]:
        """A deterministic sample: shuffle the canonical order with ``random.Random(seed)`` and keep the first n.

        Samples are nested (the first 5 of seed 42 are the first 5 of its 2,000-question sample).
        """
        ids = self.all_task_ids()
        if n is None or n >= len(ids):
            return ids
        order = list(ids)
        random.Random(seed).shuffle(order)
        return order[:n]

    def default_corpus(self) -> tuple[list[Paragraph], str]:
        _ = self.tasks
        paragraphs = context_paragraphs(self._rows)
        if not paragraphs:
            raise UserError(
                "hotpotqa: these questions carry no context paragraphs (e.g. the simplified dev file); "
                "pass --corpus FILE (JSONL {title, text}) or --retrieval es --es-url URL --es-index NAME"
            )
        return paragraphs, CONTEXT_CORPUS_LABEL

    def finish(self, task: QATask, answer: str) -> EnvResponse:
        if not answer.strip():
            raise InvalidAction("Finish needs a non-empty answer: Finish[answer]")
        em = exact_match(answer, task.answer)
        f1 = f1_score(answer, task.answer)
        return EnvResponse(
            observation=f"Episode finished with answer: {answer}",
            done=True,
            outcome=em,
            reward=float(em),
            reward_info={"answer": answer, "gold": task.answer, "em": em, "f1": round(f1, 6)},
        )

    @classmethod
    def canonical_answer(cls, episode: Episode) -> str | None:
        """The SQuAD-normalised ``Finish`` answer (the form exact match compares): ``The Beatles.`` → ``beatles``."""
        answer = cls.finish_argument(episode)
        return None if answer is None else normalize_answer(answer)
