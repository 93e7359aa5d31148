"""The judge analysis and the certificate of the report's runs (`uqh report --judgments DIR --certify FILE`).

- :func:`judgments_for_report` -- :func:`uqh.scoring.judges.analysis.analyse_judgments` of a judge directory, and
  per report run its judgments by episode, for the trace explorer's link from a trajectory to its judgments;
- :func:`read_certificates` -- the typed :class:`CertifyResult` list from the JSON ``uqh certify --format json``
  wrote (one result or a list).

Both fail with one-line :class:`UserError` before the report writes anything. Computes nothing of its own.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from uqh.rundir.errors import UserError, read_user_text
from uqh.rundir.judgments import JudgeDir, Judgment, JudgeMetric
from uqh.scoring.certify.certificate_results import CertifyResult
from uqh.scoring.judges.judge_results import JudgeAnalysis

#: characters of a judge's rationale embedded in the page per judgment
RATIONALE_CHARS = 600


def judgment_view(j: Judgment) -> dict[str, Any]:
    """What the trace explorer shows of one judgment: judge, repeat, score (or why missing), cited steps."""
    return {"metric": j.metric.value, "label": JudgeMetric(j.metric).label, "repeat": j.repeat, "score": j.score,
            "missing": j.missing_reason, "cited": list(j.cited_steps),
            "rationale": (j.rationale or "")[:RATIONALE_CHARS]}


def judgments_for_report(judge_dir: Path, run_paths: list[Path], *, n_bootstrap: int,
                         seed: int) -> tuple[JudgeAnalysis, list[dict[str, list[dict[str, Any]]]]]:
    """The analysis of ``judge_dir`` and, for each of ``run_paths`` (the report's runs, in order), its judgments
    by episode id (empty for a run the directory did not judge). UserError when ``judge_dir`` is not a judge
    directory or judges none of the report's runs."""
    from uqh.scoring.judges.analysis import analyse_judgments

    jd = JudgeDir.open(judge_dir)  # UserError (one line) when it is not a judge directory
    judged = [Path(r.path).resolve() for r in jd.config.runs]
    wanted = [Path(p).resolve() for p in run_paths]
    if not set(judged) & set(wanted):
        raise UserError(f"--judgments {judge_dir} judges {', '.join(map(str, judged))}, none of the report's runs; "
                        "add those run directories")
    analysis = analyse_judgments(judge_dir, n_bootstrap=n_bootstrap, seed=seed)
    by_run: list[dict[str, list[dict[str, Any]]]] = [{} for _ in wanted]
    slot = {i: wanted.index(p) for i, p in enumerate(judged) if p in wanted}
    for j in sorted(jd.judgments(), key=lambda j: (j.run, j.episode_id, j.metric.value, j.repeat)):
        if j.run in slot:
            by_run[slot[j.run]].setdefault(j.episode_id, []).append(judgment_view(j))
    return analysis, by_run


def read_certificates(path: Path, run_paths: list[Path] | None = None) -> list[CertifyResult]:
    """The certificate(s) in ``path``, the JSON of ``uqh certify RUN... --format json``; with ``run_paths`` (the
    report's runs), UserError for a certificate of another run -- its tables would sit in this run's report."""
    from pydantic import TypeAdapter, ValidationError

    text = read_user_text(path, f"--certify {path}")  # UserError for an unreadable or non-UTF-8 file
    try:
        data = TypeAdapter(list[CertifyResult] | CertifyResult).validate_json(text)
    except ValidationError:
        raise UserError(f"--certify {path} is not a certificate; write it with `uqh certify RUN... --format json "
                        "> FILE`") from None
    results = data if isinstance(data, list) else [data]
    for result in results if run_paths is not None else ():
        if not any(same_run(result.run_dir, run) for run in run_paths):
            raise UserError(f"--certify {path} is the certificate of {result.run_dir}, not of the report's runs; "
                            f"certify them (`uqh certify RUN... --format json > FILE`) or add that run")
    return results


def same_run(recorded: str, run: Path) -> bool:
    """Whether the run directory ``recorded`` in a certificate (as given to ``uqh certify``: absolute, or relative
    to where it ran) is ``run``: equal once resolved, or a relative path that ends ``run``'s resolved path."""
    run = Path(run).resolve()
    given = Path(recorded)
    if given.resolve() == run:
        return True
    parts = [p for p in given.parts if p not in (".", "")]
    return not given.is_absolute() and ".." not in parts and bool(parts) and run.parts[-len(parts):] == tuple(parts)
