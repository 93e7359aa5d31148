"""`uqh continue`: Monte Carlo continuation branches from censored (max_steps) prefixes, then q_Z and the audit.

    uqh continue RUN_DIR --branches M --extra-steps K [--prefixes N | --sample N [--seed S] | --ids ID ...]
                 [--min-valid 5]
                 --out CONT_DIR [--concurrency C] [--qz-method hybrid|mc|plugin] [--stop-rule fixed|ci:H]

Re-running the same command resumes an interrupted continuation run (finished branches are kept); so does the
same command with a larger --branches, which adds the missing branches (a smaller one is refused).
With ``--qz-only`` no model is called: q_Z and the audit are recomputed from the branches already in CONT_DIR.
"""
from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from pathlib import Path

from uqh.cli import arg_types
from uqh.cli.arguments import add_backend_arguments, print_endpoint_lines
from uqh.harness.backends import make_backend
from uqh.harness.config.build import endpoint_overrides
from uqh.harness.config.settings import BatchSettings, ClientSettings
from uqh.harness.continuation import PrefixSample, run_continuations
from uqh.harness.sampling.branch_rules import parse_stop_rule
from uqh.harness.store import lock as run_lock
from uqh.reports.render import add_format_argument, emit
from uqh.rundir.errors import UserError
from uqh.rundir.reader import RunDir, is_run_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="source run directory (read only)")
    p.add_argument("--branches", "-M", type=int, default=10,
                   help="continuation branches per prefix (default 10); the maximum under a sequential --stop-rule. "
                        "A larger M resumes CONT_DIR with its finished branches kept")
    p.add_argument("--stop-rule", default="fixed", metavar="RULE",
                   help="fixed (default: M branches per prefix, the paper's design) or ci:H (rounds of branches; a "
                        "prefix stops once its 95%% anytime-valid interval for q_Z has half-width <= H, else at M)")
    p.add_argument("--extra-steps", "-K", type=int, help="extra step budget per branch (default: the source budget)")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--prefixes", type=int, metavar="N", help="continue the first N max_steps episodes (canonical order)")
    sel.add_argument("--sample", type=int, metavar="N",
                     help="continue a seeded random sample of N max_steps episodes (the paper's H.2 protocol; all of "
                          "them when there are fewer), recorded in the manifest")
    sel.add_argument("--ids", nargs="+", metavar="ID", help="continue exactly these max_steps episode ids")
    p.add_argument("--seed", type=arg_types.seed, metavar="S", help="seed of the --sample draw (default 0)")
    p.add_argument("--min-valid", type=int, default=5,
                   help="resolved non-parse-error branches a prefix needs for an MC estimate (default 5)")
    p.add_argument("--out", required=True, metavar="CONT_DIR", help="continuation run directory (new or to resume)")
    p.add_argument("--concurrency", type=arg_types.count, help="branches in flight at once (default 8; 2 for local: models)")
    p.add_argument("--workers", type=arg_types.count, metavar="N",
                   help="worker processes sharing --concurrency (default 1); with --backend ray: Ray actors "
                        "(default: one per CPU of the cluster)")
    add_backend_arguments(p)
    p.add_argument("--api-base", action="append", metavar="URL",
                   help="override the source run's endpoint (e.g. a restarted server); repeat it for several "
                        "replicas of the model")
    p.add_argument("--endpoints", metavar="FILE", help="a file of endpoint URLs, one per line (as --api-base repeated)")
    p.add_argument("--qz-method", choices=("hybrid", "mc", "plugin"), default="hybrid",
                   help="q_Z estimator written to qz.jsonl (default hybrid: MC where retained, plug-in elsewhere)")
    p.add_argument("--plugin-train-complete", action="store_true",
                   help="also train the plug-in q_Z model on the source run's complete episodes (prefix before the "
                        "final step, label Y)")
    p.add_argument("--score", default="log", help="score rule of the audit (log, brier, beta:A,B; default log)")
    p.add_argument("--weights", default="linear-front", help="weight schedule of the audit (default linear-front)")
    p.add_argument("--bootstrap", type=arg_types.resamples, default=1000, help="bootstrap resamples of the audit CIs (default 1000)")
    p.add_argument("--qz-only", action="store_true", help="no model calls: recompute qz.jsonl and the audit")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.add_argument("--timeout", type=arg_types.timeout, metavar="S",
                   help="seconds one model call may take before it counts as failed (default 600; retried)")
    p.add_argument("--max-retries", type=arg_types.count_or_zero, metavar="N",
                   help="retries of a transient model-call failure (default 6)")
    add_format_argument(p)


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as lock_scope:  # CONT_DIR's writer lock, held until q_Z and the audit are written
        return _run(args, lock_scope)


def batch_settings_from_args(args: argparse.Namespace) -> BatchSettings:
    """How the branches run: the one :class:`uqh.harness.config.settings.BatchSettings` of the flags, as
    ``uqh run`` builds it (each flag's range was checked by its type when parsed)."""
    given = {k: v for k, v in (("timeout_s", args.timeout), ("max_retries", args.max_retries)) if v is not None}
    return BatchSettings(concurrency=args.concurrency, workers=args.workers, backend=args.backend,
                         ray_address=args.ray_address, progress=not args.no_progress, client=ClientSettings(**given))


def _check_args(args: argparse.Namespace) -> None:
    """What the flags' types cannot check alone; bad audit settings fail before any model call."""
    from uqh.scoring.rules import parse_score
    from uqh.scoring.weights import check_scheme

    if args.seed is not None and args.sample is None:
        raise UserError("--seed only seeds the --sample draw; add --sample N (or drop --seed)")
    if args.sample is not None and args.sample < 1:
        raise UserError("--sample must be at least 1")
    if args.min_valid < 1:
        raise UserError("--min-valid must be at least 1")
    parse_score(args.score)
    check_scheme(args.weights)
    if run_lock.is_held(Path(args.run_dir)):  # its prefixes are still being written: continue them once it ends
        raise UserError(f"{args.run_dir} is still being written by {run_lock.holder_text(Path(args.run_dir))}; "
                        "continue it once that run has finished")


def _run(args: argparse.Namespace, lock_scope: contextlib.ExitStack) -> int:
    from uqh.reports.continuation_audit import audit_continuation, audit_output

    settings = batch_settings_from_args(args)
    _check_args(args)
    stop_rule = parse_stop_rule(args.stop_rule)
    if args.qz_only:
        _check_qz_only(args)
        lock_scope.enter_context(run_lock.hold(Path(args.out)))  # q_Z and the audit are written there
    else:
        code = _continue(args, settings, stop_rule, lock_scope)
        if code:
            return code
    estimate, _ = audit_continuation(args.out, min_valid=args.min_valid, method=args.qz_method, rule=args.score,
                                     weights=args.weights, n_boot=args.bootstrap,
                                     train_complete=args.plugin_train_complete)
    emit(audit_output(estimate.audit), args.format)
    stream = sys.stderr if args.format in ("json", "csv") else sys.stdout
    for line in next_steps(estimate, Path(args.out), args):
        print(line, file=stream)
    return 0


def _check_qz_only(args: argparse.Namespace) -> None:
    """``--qz-only``: CONT_DIR must be a continuation run of RUN_DIR."""
    if not is_run_dir(args.out):
        raise UserError(f"{args.out} is not a continuation run directory (no manifest.json); run `uqh continue` "
                        "without --qz-only first")
    cont = RunDir.open(args.out)
    if not cont.is_continuation:
        raise UserError(f"{args.out} is not a continuation run (its manifest has no continuation section)")
    source = Path(cont.config.continuation["source_run_dir"])
    if source.resolve() != Path(args.run_dir).resolve():
        raise UserError(f"{args.out} continues the run {source}, not {args.run_dir}; pass that run directory")


def _continue(args: argparse.Namespace, settings: BatchSettings, stop_rule, lock_scope) -> int:
    """Run the branches and print what was done; the exit code when the batch stopped early, else 0."""
    backend = make_backend(settings.backend, workers=settings.workers, ray_address=settings.ray_address)
    endpoints = endpoint_overrides(args.api_base, args.endpoints)
    report = run_continuations(
        Path(args.run_dir), Path(args.out), branches=args.branches, extra_steps=args.extra_steps,
        n_prefixes=args.prefixes, ids=args.ids, api_base=endpoints.get("api_bases") or endpoints.get("api_base"),
        settings=settings, lock_scope=lock_scope, stop_rule=stop_rule, backend=backend,
        sample=PrefixSample(args.sample, args.seed or 0) if args.sample is not None else None,
    )
    if report.grown_from is not None:
        print(f"--branches {args.branches}: {args.out} had {report.grown_from} per prefix; its finished branches "
              "are kept")
    for s in report.skipped:
        print(f"skipped {s.episode_id}: {s.reason}")
    how = f"sampled with seed {args.seed or 0}" if args.sample is not None else "selected"
    print(f"{report.n_prefixes} prefixes {how}, {len(report.skipped)} skipped (not replayable), "
          f"{report.n_branches_written} branches written to {args.out}")
    if report.decisions:
        print(stop_summary(report))
    print_endpoint_lines(report.summary)
    stopped = report.summary.stopped if report.summary is not None else None
    if stopped is not None:
        print(f"uqh continue: {stopped.message}; {report.n_branches_missing} branches not finished; {stopped.hint}",
              file=sys.stderr)
        return stopped.exit_code
    if report.n_branches_missing:
        print(f"{report.n_branches_missing} branches did not finish (model failures); re-run the command to resume")
    return 0


def next_steps(estimate, out, args: argparse.Namespace) -> list[str]:
    """What the q_Z file is good for, as a command that works with what it holds: every censored prefix has an
    estimate -> the exact censored score; some -> the same with the others excluded; none -> say so, and the
    simple censored score meanwhile."""
    c = estimate.audit.counts
    q = shlex.quote
    # both paths as the user gave them (the source as on the command line, not the resolved path the manifest keeps)
    source, qz_file = q(str(args.run_dir)), q(str(out / "qz.jsonl"))
    exact = f"uqh score {source} --censoring exact --q-z {qz_file}"
    lines = []
    if c.retained == 0:
        m = estimate.audit.cost.max_branches if estimate.audit.cost is not None else None
        more = f"a --branches larger than {m}" if m else "a larger --branches"
        again = "`uqh continue` without --qz-only" if args.qz_only else "the same command"
        lower = " or lower --min-valid" if c.min_valid > 1 else ""
        lines.append(f"no prefix retained: none of the {c.prefixes_with_branches} continued prefixes has {c.min_valid} "
                     f"valid resolved branches (--min-valid {c.min_valid}); q_Z file has {c.records} estimates "
                     f"({c.records_plugin} plug-in). Run more branches ({again} with {more} keeps the finished "
                     f"ones){lower}.")
    if c.records == 0:
        lines.append(f"next: uqh score {source} --censoring simple   (no q_hat_Z to score the exact censored "
                     "score with)")
    elif c.without_estimate:
        lines.append(f"next: {exact} --missing-qz exclude   ({c.without_estimate} censored prefixes without an "
                     "estimate are left out and counted)")
    else:
        lines.append(f"next: {exact}")
    return lines


def stop_summary(report) -> str:
    """One line on what a sequential stop rule did."""
    by = {"half_width": 0, "max_branches": 0, None: 0}
    for d in report.decisions:
        by[d.stopped_by] += 1
    share = report.n_branches_written / report.n_branches_max if report.n_branches_max else 0.0
    line = (f"stop rule {report.stop_rule}: {by['half_width']} prefixes stopped at the half-width, "
            f"{by['max_branches']} at --branches; {report.n_branches_written} of at most {report.n_branches_max} "
            f"branches run ({100 * share:.0f}%)")
    if by[None]:
        line += f"; {by[None]} prefixes open (a round did not finish; re-run to resume)"
    return line
