"""`uqh score`: Trajectory Proper Score, censored extensions and diagnostics of run directories.

Thin CLI over :func:`uqh.scoring.pipeline.score_run` (and :func:`uqh.scoring.paired.compare_runs` with ``--paired``);
heavy imports stay inside :func:`run`. :mod:`uqh.reports.score_view` arranges the results -- one table for all runs,
CIs under the values -- and :mod:`uqh.reports.render` prints them as ``--format table|md|json|csv``. ``json`` is the
:class:`uqh.scoring.results.RunScores` dump (a list of them for several runs; ``{"runs": [...], "paired": [...]}``
with ``--paired``).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from uqh.cli import arg_types
from uqh.cli.arguments import check_distinct_runs, check_runs_have_episodes, run_notes
from uqh.reports.render import add_format_argument, emit
from uqh.rundir.errors import UserError
from uqh.rundir.probes import ProbeDir
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import USER_SIDECAR_FILE, config_differences


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by `uqh run`")
    p.add_argument("--predictor", action="append", metavar="NAME",
                   help="predictor(s) of the registry (uqh.scoring.registry.PREDICTORS), repeatable or comma-separated, "
                        "e.g. verbal,token_prob,base_rate; 'all': every registered one, the white-box token signals "
                        "included (default: the default ones)")
    p.add_argument("--calibration", choices=("none", "platt", "both"), default="both",
                   help="raw rows (none), cross-fitted Platt rows (platt) or both (default)")
    p.add_argument("--score", action="append", metavar="RULE",
                   help="score family, repeatable: log, brier, beta:A,B (default: log, brier, beta:2,4)")
    p.add_argument("--weights", default="linear-front",
                   help="weight schedule: linear-front (default), uniform, exponential-front, linear-back")
    p.add_argument("--censoring", choices=("exclude", "simple", "exact"), default="exclude",
                   help="max_steps trajectories: exclude (complete-only), simple (q_Z≈0) or exact (needs --q-z)")
    p.add_argument("--labels", choices=("working", "complete"), default="working",
                   help="what the base rate and Platt are trained on under --censoring simple|exact: working (default, "
                        "the paper's: ΔY over the working sample -- Y if complete, 0 if censored; under exact Y or "
                        "q_hat_Z) or complete (Y of the complete trajectories only)")
    p.add_argument("--probes", action="append", metavar="DIR",
                   help="probe directory written by `uqh probe` (repeatable): its values become the probe's predictor "
                        "(p_true) for the runs it probed; its calls and tokens are noted")
    p.add_argument("--q-z", dest="q_z", metavar="FILE", help="q_Z file (JSONL from `uqh continue`) for --censoring exact")
    p.add_argument("--missing-qz", choices=("error", "exclude"), default="error",
                   help="censored episodes without a q_hat_z under --censoring exact: error (default) or exclude "
                        "them (counted)")
    p.add_argument("--include-parse-errors", action="store_true",
                   help="sensitivity analysis (Appendix G.2): score parse_error trajectories as censored")
    p.add_argument("--bootstrap", type=arg_types.resamples_or_none, default=1000, metavar="N", help="paired bootstrap resamples (0: none)")
    p.add_argument("--seed", type=arg_types.seed, default=0, help="bootstrap seed")
    p.add_argument("--no-auq", action="store_true", help="omit the scalar AUQ aggregator table (Φ_last, Φ_avg, Φ_min)")
    p.add_argument("--fixed-rank", action="store_true", help="add the fixed-rank analysis of Appendix E")
    p.add_argument("--pooled", action="store_true", help="also score all RUN_DIRs pooled into one sample")
    p.add_argument("--learned-penalty", choices=("ridge", "lasso"), default="ridge",
                   help="penalty of the learned calibrator (the htc predictor's logistic model; default ridge)")
    p.add_argument("--calibrator-from", metavar="RUN_DIR",
                   help="fit the learned calibrator (htc) on this run directory and apply it to the scored runs "
                        "(transfer across runs or domains) instead of cross-fitting it on them")
    p.add_argument("--agentuq-conventions", action="store_true",
                   help="agentuq's conventions instead of uqh's: every call of a step (repairs and failed calls) in "
                        "the per-role summaries, entropy in nats with a token without top-k counted as 0, the "
                        "final user reply at the last step, AUARC ties in input order")
    p.add_argument("--paired", action="store_true",
                   help="compare each RUN_DIR with the first on the task ids both ran: Δ per metric with a 95%% CI "
                        "by paired bootstrap over the shared tasks (is model B better calibrated than model A?)")

    add_format_argument(p)


def options_from_args(args: argparse.Namespace):
    """Validate flags into :class:`uqh.scoring.pipeline.ScoreOptions` (UserError on bad input)."""
    from uqh.scoring.pipeline import ScoreOptions
    from uqh.scoring.rules import DEFAULT_SCORES, parse_score
    from uqh.scoring.streams import check_predictor
    from uqh.scoring.weights import check_scheme

    preds: list[str] = []
    every = False
    for item in args.predictor or []:
        for name in item.split(","):
            if name.strip() == "all":
                every = True
            elif name.strip() and check_predictor(name.strip()) not in preds:
                preds.append(name.strip())
    if every and preds:
        raise UserError("--predictor all already names every predictor; give it alone")
    rules = [parse_score(s) for s in (args.score or DEFAULT_SCORES)]
    if len({r.name for r in rules}) != len(rules):
        raise UserError("the same --score was given twice")
    check_scheme(args.weights)
    if args.censoring == "exact":
        if not args.q_z:
            raise UserError("--censoring exact needs --q-z FILE (the q_Z file written by `uqh continue`)")
        # the file is read once the runs are known: each run gets its own share of it (run())
    elif args.q_z:
        raise UserError("--q-z is only used with --censoring exact")
    if args.include_parse_errors and args.censoring == "exclude":
        raise UserError("--include-parse-errors treats parse errors as censored; use it with --censoring simple or exact")
    cal = {"none": ("none",), "platt": ("platt",), "both": ("none", "platt")}[args.calibration]
    return ScoreOptions(
        predictors=tuple(preds) if preds else None,
        every_predictor=every,
        calibrations=cal,
        scores=tuple(rules),
        weights=args.weights,
        censoring=args.censoring,
        labels=args.labels,
        include_parse_errors=args.include_parse_errors,
        missing_qz=args.missing_qz,
        n_bootstrap=args.bootstrap,
        seed=args.seed,
        auq=not args.no_auq,
        fixed_rank=args.fixed_rank,
        learned_penalty=args.learned_penalty,
        agentuq_conventions=args.agentuq_conventions,
    )


def no_complete_reason(counts, censoring: str) -> str:
    """Why a run's table is empty: it has no complete (clean, with an outcome) episode, by exclusion reason."""
    excluded = ", ".join(f"{k}={v}" for k, v in counts.exclusions().items()) or "none excluded"
    return (f"no complete episode to score: {counts.episodes} episodes ({excluded}); every metric needs episodes "
            f"that ended clean with an outcome" + (" (--censoring exclude leaves out max_steps episodes)"
                                                   if censoring == "exclude" and counts.excluded_max_steps else ""))


def pooling_warning(runs) -> str | None:
    """A warning when ``--pooled`` mixes runs whose configs differ (task lists aside), naming the fields."""

    first = runs[0].manifest.config
    fields: list[str] = []
    for r in runs[1:]:
        for f in config_differences(first, r.manifest.config):
            if f not in fields and f not in ("task_ids", "prompt_sha256"):
                fields.append(f)
    if not fields:
        return None
    return (f"--pooled mixes runs whose configs differ in {', '.join(fields)}; the pooled row averages over "
            "different settings")


def probe_cost_note(probe_dir) -> str:
    """What a probe directory's values cost: calls, tokens, USD (when priced) and how many are missing."""
    values = probe_dir.values()
    prompt = sum(v.call.usage.prompt_tokens or 0 for v in values)
    completion = sum(v.call.usage.completion_tokens or 0 for v in values)
    priced = [v.call.cost_usd for v in values if v.call.cost_usd is not None]
    cost = f"${sum(priced):.4f}" if priced and len(priced) == len(values) else "cost n/a (unpriced model)"
    missing = sum(v.value is None for v in values)
    return (f"{probe_dir.path}: probe {probe_dir.config.probe.value} by {probe_dir.config.model}: {len(values)} calls, "
            f"tokens {prompt:,} prompt + {completion:,} completion, {cost}; {missing} values missing")


def run(args: argparse.Namespace) -> int:
    from uqh.reports.score_view import score_output
    from uqh.scoring.pipeline import pool_runs, score_run
    from uqh.scoring.streams import load_run

    check_distinct_runs(args.run_dirs)
    check_runs_have_episodes(args.run_dirs)
    opts = options_from_args(args)
    if args.paired and len(args.run_dirs) < 2:
        raise UserError("--paired compares runs: give at least two RUN_DIRs (each is compared with the first)")

    probes = [ProbeDir.open(d) for d in args.probes or []]
    runs = [load_run(d, probes, agentuq_conventions=opts.agentuq_conventions) for d in args.run_dirs]
    if args.calibrator_from:  # validated with the runs, before anything is printed
        opts = dataclasses.replace(opts, calibrator_from=load_run(args.calibrator_from,
                                                                  agentuq_conventions=opts.agentuq_conventions))
    sidecar_notes = [f"{r.run_dir}: {len(r.out_of_range_sidecar_values)} token logprob(s) out of range (NaN or "
                     f"above 0, e.g. {r.out_of_range_sidecar_values[0][1]!r}): those calls' tokens read as missing"
                     for r in runs if r.out_of_range_sidecar_values]
    for d, r in zip(args.run_dirs, runs):  # as `uqh report` and `uqh certify`: nothing to score is a user error
        if len(r.episode_ids) == 0:
            raise UserError(f"{d} has no finished episodes yet; run `uqh run` first (or drop it from the list)")
    opts_of = [opts] * len(runs)
    if opts.censoring == "exact":  # each run gets the q_Z of its own continuation (episode ids repeat across runs)
        from uqh.rundir.qz_file import qz_for_runs

        per_run = qz_for_runs([args.q_z], [(r.run_dir, r.manifest.config_hash) for r in runs])
        opts_of = [dataclasses.replace(opts, q_z=q) for q in per_run]
    from uqh.scoring.streams import greedy_refusal

    for r in runs:  # a greedy-only predictor asked for by name on a sampled run: one line, nothing scored
        for name in opts.predictors or ():
            refusal = greedy_refusal(r, name)
            if refusal:
                raise UserError(refusal)
    notes = [probe_cost_note(p) for p in probes] + sidecar_notes
    if opts.every_predictor:  # `--predictor all` leaves greedy-only predictors out of sampled runs: say so
        from uqh.scoring.registry import PREDICTORS

        for r in runs:
            left_out = [p for p in PREDICTORS if greedy_refusal(r, p)]
            if left_out:
                notes.append(f"{r.run_dir}: greedy-only predictors not scored (temperature "
                             f"{r.manifest.config.decoding.temperature:g} > 0): {', '.join(left_out)}")
    notes += user_role_notes(runs, opts.predictor_names())
    for d in args.run_dirs:  # a sidecar cut from outside: say so, not only "skipped" in the counts
        notes += run_notes(d)
        missing = RunDir.open(d).episodes_missing_sidecar_rows()
        if missing:
            notes.append(f"{d}: {len(missing)} finished episodes miss {sum(missing.values())} sidecar rows "
                         "(logprobs.jsonl cut outside uqh?); their logprob predictors are missing")
    if opts.censoring == "exact":
        # ids must be covered in every run before scoring starts
        from uqh.scoring.streams import build_sample

        for r, o in zip(runs, opts_of):
            build_sample(r, "verbal", censoring="exact", q_z=o.q_z, include_parse_errors=o.include_parse_errors,
                         missing_qz=o.missing_qz)
    comparisons = []
    if args.paired:
        from uqh.scoring.paired import compare_runs

        comparisons = [compare_runs(runs[0], r, opts_of[0], o) for r, o in zip(runs[1:], opts_of[1:])]
    targets = list(runs)
    if args.pooled and len(runs) > 1:
        warning = pooling_warning(runs)
        if warning:
            print(f"uqh score: warning: {warning}", file=sys.stderr)
        targets.append(pool_runs(runs))
        opts_of.append(opts if opts.censoring != "exact" else dataclasses.replace(  # pool_runs prefixes ids "k:"
            opts, q_z={f"{k}:{e}": v for k, o in enumerate(opts_of) for e, v in o.q_z.items()}))
    results = [score_run(r, o) for r, o in zip(targets, opts_of)]
    for res in results:
        if res.counts.complete == 0:
            notes.append(f"{res.run_dir}: {no_complete_reason(res.counts, opts.censoring)}")
    emit(score_output(results, comparisons, notes), args.format)
    return 0


def user_role_notes(runs, names) -> list[str]:
    """One line per run without a user sidecar when user or combined per-role predictors are scored: why their
    values are all missing."""
    from uqh.scoring.registry import PREDICTORS

    asked = [n for n in names if PREDICTORS[n].role is not None and PREDICTORS[n].role.role != "assistant"]
    if not asked:
        return []
    return [f"{r.run_dir}: the user and combined per-role predictors are missing: the run has no {USER_SIDECAR_FILE} "
            "(Tau2 runs record it with `uqh run --user-logprobs`)" for r in runs if not r.has_user_sidecar]
