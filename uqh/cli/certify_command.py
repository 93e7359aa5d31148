"""`uqh certify`: the reliability level of an agent on a task, by self-consistency and conformal calibration
(Mouzouni, "Black-box reliability certification"; docs/certify.md).

Thin: each run directory's episodes become one :class:`uqh.scoring.certify.certificate.CertifyItem` per task -- the canonical
answer of every sample (recorded at run time, or computed now by the domain's ``canonical_answer``) and the
benchmark's verdict -- the stopping rules of :mod:`uqh.harness.sampling.consensus` are replayed on the recorded samples, and
:func:`uqh.scoring.certify.certificate.certify_items` computes the certificate that :mod:`uqh.reports.certify_tables` renders.

Human verification (Definition 2.1 with a person as the acceptability predicate): ``--export-verification FILE``
writes one CSV row per calibration item (question, top answer, votes, the other answers, an example action and an
empty ``acceptable`` column); ``--verified FILE`` reads the marks back, and the file's items are the calibration
set. Every input is validated before anything is written or printed: a mistake is one line and exit 2.
"""
from __future__ import annotations

import argparse
import csv
import sys

from uqh.cli import arg_types
from uqh.cli.arg_types import finite_float
from uqh.domains.domain_registry import get_domain_class
from uqh.harness.sampling.consensus import RULES, stopping_time
from uqh.reports.render import add_format_argument, emit
from uqh.rundir.errors import UserError, read_user_text
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import CANONICAL_ANSWER_KEY, StopReason

NO_ANSWER = "(no answer)"
VERIFY_FIELDS = ("task_id", "question", "top_answer", "votes", "other_answers", "example_action", "acceptable")
_YES = {"1", "yes", "y", "true", "t", "accept", "accepted", "correct"}
_NO = {"0", "no", "n", "false", "f", "reject", "rejected", "wrong"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories of `uqh run --samples K`")
    p.add_argument("--alpha", type=finite_float, default=0.1, help="miscoverage level α of the certificate (default 0.1)")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--cal-frac", type=finite_float, metavar="F",
                       help="fraction of the tasks in the calibration split (default 0.5; 1.0: every task, the "
                            "reliability level without a test split)")
    split.add_argument("--cal-ids", metavar="FILE",
                       help="calibration task ids, one per line (the rest is the test split)")
    p.add_argument("--seed", type=arg_types.seed, default=0, help="seed of the split, the tie-breaking and the bootstrap")
    p.add_argument("--score", choices=("rank", "cp"), default="rank",
                   help="nonconformity score: rank (Definition 6.2, default) or cp (cumulative probability, 6.3)")
    p.add_argument("--resplits", type=arg_types.count_or_zero, default=100, metavar="R",
                   help="random re-splits for split stability (0: none)")
    p.add_argument("--bootstrap", type=arg_types.resamples_or_none, default=1000, metavar="B", help="bootstrap resamples of mean CIs (0: none)")
    p.add_argument("--stop-delta", type=finite_float, default=0.05, metavar="DELTA",
                   help="level of the stopping rules replayed on the recorded samples (default 0.05)")
    v = p.add_mutually_exclusive_group()
    v.add_argument("--export-verification", metavar="FILE",
                   help="write the calibration items' questions and top answers to FILE (CSV) for a human to mark")
    v.add_argument("--verified", metavar="FILE",
                   help="calibrate on the human marks of FILE (an exported CSV with its 'acceptable' column filled)")

    add_format_argument(p)


# ------------------------------------------------------------------------------------------ run dir -> items


def load_items(run_dir: str):
    """(reader, items, canonicalised-now count, per task: question and per-class example action)."""
    from uqh.harness.sampling.scheduler import canonical_of
    from uqh.scoring.certify.certificate import CertifyItem

    reader = RunDir.open(run_dir)
    if reader.is_continuation:
        raise UserError(f"{run_dir} is a continuation run; certify the `uqh run` directory of the K samples")
    cls = get_domain_class(reader.config.domain)
    if not cls.has_canonical_answer():
        raise UserError(f"the {cls.name} domain defines no canonical answer (Domain.canonical_answer); cannot certify")
    episodes = [ep for ep in (reader.episodes() if reader.has_episodes_file else []) if ep.source_episode_id is None]
    if not episodes:
        raise UserError(f"{run_dir} has no finished episodes; run `uqh run --samples K` first")
    by_task: dict[str, list] = {}
    for ep in episodes:
        by_task.setdefault(ep.task_id, []).append(ep)
    order = {t: i for i, t in enumerate(reader.config.task_ids)}
    items, context, now = [], {}, 0
    for task in sorted(by_task, key=lambda t: (order.get(t, len(order)), t)):
        eps = sorted(by_task[task], key=lambda e: e.sample_index)
        classes = []
        for ep in eps:
            now += CANONICAL_ANSWER_KEY not in ep.info
            classes.append(canonical_of(cls, ep))
        accepted = tuple(ep.stop_reason == StopReason.clean and ep.outcome == 1 for ep in eps)
        items.append(CertifyItem(task, tuple(classes), accepted))
        examples = {}
        for c, ep in zip(classes, eps):
            examples.setdefault(c, ep.steps[-1].action if ep.steps else "")
        context[task] = (eps[0].task_prompt, examples)
    return reader, items, now, context


def _read_cal_ids(path: str, known: set[str]) -> list[str]:
    lines = read_user_text(path, f"--cal-ids {path}").splitlines()
    ids = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    if not ids:
        raise UserError(f"--cal-ids {path} lists no task id")
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise UserError(f"--cal-ids {path}: {len(unknown)} id(s) not among the run's tasks, e.g. {unknown[0]!r}")
    if len(set(ids)) != len(ids):
        raise UserError(f"--cal-ids {path} lists a task twice")
    return ids


def _top(item, seed: int):
    from uqh.scoring.certify.conformal import rank_classes

    return rank_classes(item.task_id, item.classes, seed)


def _answer(cls: str | None) -> str:
    return NO_ANSWER if cls is None else cls


def verification_rows(items, cal_mask, context, seed: int) -> list[dict]:
    """One row per calibration item: what a person needs to mark the top answer right or wrong."""
    rows = []
    for item, cal in zip(items, cal_mask):
        if not cal:
            continue
        ranked = _top(item, seed)
        (top, votes), rest = ranked[0], ranked[1:]
        question, examples = context[item.task_id]
        rows.append({
            "task_id": item.task_id, "question": question, "top_answer": _answer(top),
            "votes": f"{votes}/{len(item.classes)}",
            "other_answers": " | ".join(f"{_answer(c)} ({n})" for c, n in rest),
            "example_action": examples.get(top, ""), "acceptable": "",
        })
    return rows


def read_verified(path: str, items, seed: int) -> dict[str, bool]:
    """The human marks of a verification file: {task_id: acceptable}, checked against the run's top answers."""

    by_id = {it.task_id: it for it in items}
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in ("task_id", "top_answer", "acceptable") if c not in (reader.fieldnames or [])]
            if missing:
                raise UserError(f"--verified {path} lacks the column(s) {', '.join(missing)}; use the file written by "
                                "--export-verification")
            rows = list(reader)
    except OSError as exc:
        raise UserError(f"cannot read --verified {path}: {exc.strerror or exc}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise UserError(f"--verified {path} is not a readable CSV file ({exc})") from None
    marks: dict[str, bool] = {}
    for n, row in enumerate(rows, start=2):
        task = (row.get("task_id") or "").strip()
        if task not in by_id:
            raise UserError(f"--verified {path} line {n}: task {task!r} is not in the run")
        if task in marks:
            raise UserError(f"--verified {path} line {n}: task {task!r} is marked twice")
        mark = (row.get("acceptable") or "").strip().lower()
        if mark not in _YES | _NO:
            raise UserError(f"--verified {path} line {n}: acceptable must be 1 or 0 (yes/no), got {mark!r}")
        top = _answer(_top(by_id[task], seed)[0][0])
        if (row.get("top_answer") or "") != top:
            raise UserError(f"--verified {path} line {n}: the top answer of {task!r} is {top!r} in this run, the file "
                            f"says {row.get('top_answer')!r}; use the run and --seed the file was exported with")
        marks[task] = mark in _YES
    if not marks:
        raise UserError(f"--verified {path} marks no task")
    return marks


def _check_args(args: argparse.Namespace) -> None:
    if not 0 < args.alpha < 1:
        raise UserError(f"--alpha must be in (0, 1), got {args.alpha}")
    if args.cal_frac is not None and not 0 < args.cal_frac <= 1:
        raise UserError(f"--cal-frac must be in (0, 1], got {args.cal_frac}")
    if not 0 < args.stop_delta < 1:
        raise UserError(f"--stop-delta must be in (0, 1), got {args.stop_delta}")
    if (args.verified or args.export_verification) and len(args.run_dirs) != 1:
        raise UserError("--verified and --export-verification take exactly one RUN_DIR")
    if args.verified and (args.cal_ids or args.cal_frac is not None):
        raise UserError("--verified sets the calibration split (the file's tasks); drop --cal-frac / --cal-ids")
    if args.export_verification:
        from pathlib import Path

        from uqh.rundir.output_dir import access_reason, enclosing_run_dir

        out = Path(args.export_verification)
        if out.exists():
            raise UserError(f"--export-verification {out} exists; choose a new file (marks are never overwritten)")
        if not out.parent.is_dir():
            raise UserError(f"--export-verification {out}: the directory {out.parent} does not exist")
        if enclosing_run_dir(out.parent) is not None:
            raise UserError(f"--export-verification {out} is inside the run directory {enclosing_run_dir(out.parent)}, "
                            "where only the run's writer adds files; write it outside")
        import os

        if not os.access(out.parent, os.W_OK | os.X_OK):
            raise UserError(f"cannot write --export-verification {out}: {access_reason(out.parent)}; choose a "
                            "writable directory")


def certify_run(run_dir: str, args: argparse.Namespace):
    """(result, items, context, options) of one run directory."""
    from uqh.scoring.certify.certificate import CertifyOptions, certify_items
    from uqh.scoring.certify.certificate_results import RunStopping

    reader, items, now, context = load_items(run_dir)
    known = {it.task_id for it in items}
    opts = CertifyOptions(alpha=args.alpha, score=args.score, seed=args.seed, resplits=args.resplits,
                          n_bootstrap=args.bootstrap, stop_delta=args.stop_delta,
                          cal_frac=args.cal_frac if args.cal_frac is not None else 0.5)
    if args.cal_ids:
        opts.cal_ids, opts.cal_ids_label, opts.cal_frac = _read_cal_ids(args.cal_ids, known), args.cal_ids, None
    if args.verified:
        opts.verified = read_verified(args.verified, items, args.seed)
        opts.cal_ids, opts.cal_ids_label, opts.cal_frac = list(opts.verified), args.verified, None
    if opts.cal_frac is not None and opts.cal_frac < 1 and not 0 < round(opts.cal_frac * len(items)) < len(items):
        raise UserError(f"--cal-frac {opts.cal_frac} leaves an empty calibration or test split of {len(items)} tasks; "
                        "use --cal-frac 1.0 for the reliability level alone")
    stopping = {rule: [stopping_time(it.classes, rule, args.stop_delta) or len(it.classes) for it in items]
                for rule in RULES}
    run_stopping = None
    stop = reader.config.consensus_stopping
    if stop is not None:
        skipped = reader.skipped_samples()
        run_stopping = RunStopping(rule=stop.rule, delta=stop.delta,
                                   samples_planned=len(reader.config.task_ids) * reader.config.samples_per_task,
                                   samples_skipped=len(skipped), tasks_stopped=len({s.task_id for s in skipped}))
    cfg = reader.config
    result = certify_items(items, opts, run_dir=str(reader.path), domain=cfg.domain, model=cfg.model,
                           canonicalised_now=now, stopping=stopping, run_stopping=run_stopping)
    return result, items, context, opts


def run(args: argparse.Namespace) -> int:
    from uqh.cli.arguments import check_runs_have_episodes, print_reading_notes

    _check_args(args)
    check_runs_have_episodes(args.run_dirs)
    done = [certify_run(d, args) for d in args.run_dirs]  # everything validated before anything is written
    print_reading_notes("uqh certify", args.run_dirs)  # e.g. "N of M planned episodes, run in progress"
    results = [r for r, _, _, _ in done]
    if args.export_verification:
        from uqh.scoring.certify.certificate import calibration_mask

        (_, items, context, opts), = done
        import io

        from uqh.rundir.atomic import atomic_create_text
        from uqh.rundir.errors import OutputWriteError, UserError

        rows = verification_rows(items, calibration_mask(items, opts), context, args.seed)
        text = io.StringIO()
        w = csv.DictWriter(text, fieldnames=VERIFY_FIELDS)
        w.writeheader()
        w.writerows(rows)
        try:  # whole or not at all (a full disk left a 0-byte file), never over an existing file
            atomic_create_text(args.export_verification, text.getvalue())
        except FileExistsError:
            raise UserError(f"--export-verification {args.export_verification} exists; choose a new file (marks "
                            "are never overwritten)") from None
        except OSError as exc:
            raise OutputWriteError(args.export_verification, exc) from None
        print(f"wrote {len(rows)} calibration items to {args.export_verification}: fill the 'acceptable' column "
              f"(1 = the top answer is acceptable, 0 = not), then run `uqh certify {args.run_dirs[0]} --verified "
              f"{args.export_verification} --seed {args.seed}`", file=sys.stderr)
        return 0
    from uqh.reports.certify_tables import certify_output

    emit(certify_output(results), args.format)
    return 0
