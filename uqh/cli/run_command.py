"""`uqh run`: run episodes of a domain into a run directory (resumable: re-run the same command to resume).

Thin: the flags become a :class:`uqh.harness.config.build.RunOverrides`, :func:`uqh.harness.config.build.resolve_config` turns a preset
plus the overrides into the RunConfig (everything is validated before anything is written: unknown
domain/preset/model string/domain option, an unusable --out, a missing API key, unknown task ids, or a config that
differs from the run already in --out each give one line on stderr and exit 2), and this module renders.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uqh.cli import arg_types
from uqh.cli.arg_types import finite_float
from uqh.cli.arguments import add_backend_arguments, print_endpoint_lines
from uqh.domains.domain_registry import domain_names, get_domain_class
from uqh.harness.config.build import LOCAL_GRAMMAR_MAX_TOKENS, LOCAL_MAX_TOKENS, endpoint_overrides
from uqh.harness.config.plan import plan, run_plan
from uqh.harness.config.presets import get_preset
from uqh.harness.config.settings import BatchSettings, ClientSettings, DecodingOverrides, RunOverrides, RunSettings
from uqh.harness.progress import duration_text
from uqh.harness.sampling.consensus import earliest_stop
from uqh.rundir.errors import UserError

if TYPE_CHECKING:
    from uqh.harness.launch import PreparedRun, RunResult

#: The QA flags: aliases of domain options (`-D key=value` sets the same option).
DOMAIN_OPTION_FLAGS = {"data": "--data", "retrieval": "--retrieval", "es_url": "--es-url", "es_index": "--es-index",
                       "top_k": "--top-k", "corpus": "--corpus", "index_dir": "--index-dir"}

EPILOG = """domain options:
  -D KEY=VALUE (repeatable) sets any option of the domain; VALUE is read as
  JSON when it parses (3, true, null, "text"), else as a string.
  `uqh run --domain NAME --list-options` lists a domain's options and defaults.
  The QA flags (--data, --retrieval, --es-url, --es-index, --top-k, --corpus,
  --index-dir) are aliases of domain options."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    g = p.add_argument_group("what to run")
    g.add_argument("--domain", help="domain name (arithmetic, strategyqa, hotpotqa, tau2-airline, ...)")
    g.add_argument("--preset", help="start from a paper preset (see uqh/harness/config/presets.py); flags override it")
    sel = g.add_mutually_exclusive_group()
    sel.add_argument("--tasks", type=arg_types.count, metavar="N", help="the domain's first/sampled N tasks")
    sel.add_argument("--task-ids", metavar="A,B,...", help="comma-separated task ids")
    g.add_argument("--samples", type=arg_types.count, metavar="K", help="episodes per task (default 1)")
    g.add_argument("--agent", metavar="NAME",
                   help="the agent: react (default; the paper's four-tag text loop) or tools (native function "
                        "calling, a required confidence argument on every tool)")
    g.add_argument("--stop-on-consensus", type=finite_float, metavar="DELTA",
                   help="sequential sampling: stop drawing a task's samples once its mode (canonical answer) is "
                        "certified at error level DELTA (Mouzouni's reliability certification, §9)")
    g.add_argument("--stop-rule", choices=("anytime", "hoeffding"),
                   help="rule of --stop-on-consensus: anytime (default; an anytime-valid majority test) or "
                        "hoeffding (the paper's Theorem 9.1 as printed: never stops before 20 samples at 0.05)")
    g.add_argument("--split", help="dataset split (domain default if omitted)")
    g.add_argument("--data", metavar="PATH", help="local data file for the domain")
    g.add_argument("--step-budget", type=arg_types.count, metavar="B", help="max steps per episode (default: the domain's)")
    g.add_argument("--observation-chars", type=arg_types.count, metavar="N",
                   help="cut observations to N chars (default: the domain's, 420; WebShop and Tau2 do not cut)")
    g.add_argument("-D", "--domain-option", action="append", default=[], metavar="KEY=VALUE", dest="domain_option",
                   help="set a domain option (repeatable; see --list-options)")
    g.add_argument("--list-options", action="store_true",
                   help="list the options of --domain (or --preset's domain; all domains if neither) and exit")

    _add_model_arguments(p.add_argument_group("model"))
    _add_retrieval_arguments(p.add_argument_group("retrieval (QA domains; aliases of -D options)"))
    _add_execution_arguments(p.add_argument_group("execution"))


def _add_model_arguments(m) -> None:
    m.add_argument("--model", help="litellm model string, openai/NAME with --api-base, or local:smollm2 (default)")
    m.add_argument("--api-base", metavar="URL", action="append",
                   help="OpenAI-compatible endpoint for --model; repeat it for several replicas of the model (calls "
                        "go to the one with the fewest in flight; a failing one is taken out of rotation)")
    m.add_argument("--endpoints", metavar="FILE",
                   help="a file of endpoint URLs for --model, one per line (as --api-base repeated)")
    m.add_argument("--user-model", metavar="M", help="user-simulator model (Tau2)")
    m.add_argument("--user-api-base", metavar="URL", help="OpenAI-compatible endpoint for --user-model (Tau2)")
    m.add_argument("--user-logprobs", action="store_true", default=None,
                   help="ask the simulated user's model for token logprobs (top --top-logprobs, default 5) and write "
                        "them to user_logprobs.jsonl (Tau2)")
    m.add_argument("--temperature", type=finite_float)
    m.add_argument("--top-p", type=finite_float)
    m.add_argument("--seed", type=arg_types.seed, help="run seed (default 42); per-episode seeds derive from it")
    m.add_argument("--max-tokens", type=arg_types.count,
                   help=f"completion cap (default 512; for local: models {LOCAL_GRAMMAR_MAX_TOKENS}, "
                        f"{LOCAL_MAX_TOKENS} with --no-grammar)")
    m.add_argument("--top-logprobs", type=arg_types.top_logprobs,
                   help="top alternatives per generated token (0-20; default 5)")
    m.add_argument("--no-logprobs", action="store_true", help="do not request token logprobs")
    m.add_argument("--grammar", action=argparse.BooleanOptionalAction, default=None,
                   help="force the four-tag shape with a llama.cpp GBNF grammar (default: on for local: models, off "
                        "otherwise; recorded in the manifest)")
    m.add_argument("--reasoning", action="store_true", default=None, help="ask the provider to enable reasoning")


def _add_retrieval_arguments(r) -> None:
    r.add_argument("--retrieval", choices=["bm25", "es"])
    r.add_argument("--es-url")
    r.add_argument("--es-index")
    r.add_argument("--top-k", type=int)
    r.add_argument("--corpus", metavar="PATH")
    r.add_argument("--index-dir", metavar="DIR",
                   help="bm25s index directory (reused or built there; not part of the config hash)")


def _add_execution_arguments(x) -> None:
    x.add_argument("--out", metavar="DIR", help="run directory (created, or resumed if it holds this run)")
    x.add_argument("--concurrency", type=arg_types.count, metavar="C", help="episodes in flight (default 8; 2 for local:)")
    x.add_argument("--workers", type=arg_types.count, metavar="N",
                   help="worker processes sharing --concurrency (default 1; use 2+ when one process is CPU-bound); "
                        "with --backend ray: Ray actors (default: one per CPU of the cluster)")
    add_backend_arguments(x)
    x.add_argument("--no-progress", action="store_true", help="no progress bar / lines")
    x.add_argument("--no-checkpoints", action="store_true", help="do not checkpoint in-flight episodes")
    x.add_argument("--timeout", type=arg_types.timeout, metavar="S",
                   help="seconds one model call (the agent's, and a simulated user's) may take before it counts as "
                        "failed (default 600; retried)")
    x.add_argument("--max-retries", type=arg_types.count_or_zero, metavar="N",
                   help="retries of a transient model-call failure (429, 5xx, timeout...; default 6)")
    x.add_argument("--breaker-failures", type=arg_types.count, metavar="N",
                   help="circuit breaker: stop the batch after N transient failures in a row across all endpoints "
                        "(default 12) ...")
    x.add_argument("--breaker-window", type=arg_types.seconds, metavar="S",
                   help="... once no call has succeeded for S seconds either (default 120)")
    x.add_argument("--dry-run", action="store_true", help="validate and print the plan; call no model, write nothing")


def parse_domain_options(items: list[str]) -> dict[str, Any]:
    """``-D key=value`` items -> {key: value}; the value is JSON when it parses (3, true, null), else the string."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UserError(f"-D expects KEY=VALUE, got {item!r}")
        if key in options:
            raise UserError(f"-D {key} is given twice; give each domain option once")
        try:
            options[key] = json.loads(text)
        except ValueError:
            options[key] = text
    return options


def overrides_from_args(args: argparse.Namespace) -> RunOverrides:
    """What to run, from the parsed flags: the :class:`uqh.harness.config.settings.RunOverrides` of a preset."""
    domain_options = parse_domain_options(args.domain_option)
    for key, flag in DOMAIN_OPTION_FLAGS.items():
        value = getattr(args, key)
        if value is None:
            continue
        if key in domain_options:
            raise UserError(f"{flag} and -D {key} both set this option; give one")
        domain_options[key] = value
    task_ids = None
    if args.task_ids is not None:
        task_ids = [t.strip() for t in args.task_ids.split(",") if t.strip()]
    decoding = DecodingOverrides(
        temperature=args.temperature, top_p=args.top_p, seed=args.seed, max_tokens=args.max_tokens,
        top_logprobs=args.top_logprobs, logprobs=False if args.no_logprobs else None, grammar=args.grammar,
        reasoning=args.reasoning,
    )
    return RunOverrides(
        domain=args.domain, split=args.split, tasks=args.tasks, task_ids=task_ids, samples=args.samples,
        step_budget=args.step_budget, observation_chars=args.observation_chars, model=args.model,
        **endpoint_overrides(args.api_base, args.endpoints), user_model=args.user_model,
        user_api_base=args.user_api_base, user_logprobs=args.user_logprobs, decoding=decoding,
        domain_options=domain_options, out=Path(args.out) if args.out else None,
        stop_on_consensus=args.stop_on_consensus, stop_rule=args.stop_rule, agent=args.agent,
    )


def settings_from_args(args: argparse.Namespace) -> RunSettings:
    """The one :class:`uqh.harness.config.settings.RunSettings` of ``uqh run``'s flags (each flag's range was
    checked by its type when parsed); it is passed down unchanged to the model client."""
    given = {k: v for k, v in (("timeout_s", args.timeout), ("max_retries", args.max_retries),
                               ("breaker_failures", args.breaker_failures),
                               ("breaker_window_s", args.breaker_window)) if v is not None}
    batch = BatchSettings(concurrency=args.concurrency, workers=args.workers, backend=args.backend,
                          ray_address=args.ray_address, progress=not args.no_progress,
                          checkpoints=not args.no_checkpoints, client=ClientSettings(**given))
    return RunSettings(preset=args.preset, run=overrides_from_args(args), batch=batch)


def options_text(domain_names: list[str]) -> str:
    """The ``--list-options`` text: each domain's options with type, default, alias flag and description."""
    blocks = []
    for name in domain_names:
        cls = get_domain_class(name)
        props = cls.Options.model_json_schema()["properties"]
        lines = [f"{name} (-D KEY=VALUE):"]
        for key, field in cls.Options.model_fields.items():
            kinds = [k for k in props[key].get("anyOf", [props[key]]) if k.get("type") != "null"]
            kind = " | ".join(" | ".join(map(json.dumps, k["enum"])) if "enum" in k else k.get("type", "any")
                              for k in kinds)
            default = cls.default_split if key == "split" else field.default  # the split's default is the domain's
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            flag = f", flag {extra['flag']}" if "flag" in extra else ""
            lines.append(f"  {key:<18} {kind} (default {json.dumps(default)}{flag})")
            lines.append(f"  {'':<18} {field.description}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _list_options(args: argparse.Namespace) -> str:
    if args.domain:
        get_domain_class(args.domain)  # unknown name: UserError
        return options_text([args.domain])
    if args.preset:
        return options_text([get_preset(args.preset).domain])
    return options_text(domain_names())


def _stopping_text(config) -> str:
    """How sequential sampling is set, and the fewest samples after which it can stop a task."""
    stop = config.consensus_stopping
    first = earliest_stop([], stop.rule, stop.delta, config.samples_per_task)
    when = (f"a task can stop after {first} unanimous samples" if first is not None
            else f"no task can stop within {config.samples_per_task} samples at this level")
    return f"{stop.rule} rule, delta={stop.delta}: {when}"


def tasks_note(config, requested: int | None) -> str | None:
    """One line when fewer tasks were planned than ``--tasks`` (or the preset) asked for, else None."""
    n = len(config.task_ids)
    if requested is None or n >= requested:
        return None
    split = f" split {config.split}" if config.split else ""
    return f"{requested:,} tasks asked for, but {config.domain}{split} has {n:,}: planning all {n:,}"


def summary_rows(summary) -> list[tuple[str, str]]:
    """The run summary of ``uqh run`` as (label, text) rows. Counts of the whole run (a resume included) come first,
    then what this invocation did; a row per endpoint would go after "model calls"."""
    s = summary.stats
    planned = summary.planned - summary.skipped
    skipped = (f"; {summary.skipped} of {summary.planned} planned samples skipped by sequential sampling"
               if summary.skipped else "")
    rows = [
        ("run directory", str(summary.run_dir)),
        ("episodes", f"{summary.finished_before + s.done}/{planned} finished ({s.done} this run, "
                     f"{summary.finished_before} before{skipped})"),
    ]
    whole = s.run_stop_reasons
    if whole:
        text = " ".join(f"{k}={v}" for k, v in sorted(whole.items()))
        if summary.finished_before:
            this = " ".join(f"{k}={v}" for k, v in sorted(s.stop_reasons.items())) or "none"
            text += f" (this run: {this})"
        rows.append(("stop reasons", text))
    if s.infra_errors:
        top = "; ".join(f"{m} (x{n})" for m, n in s.error_messages.most_common(3))
        rows.append(("infra errors", f"{s.infra_errors} this run, not written (re-run to resume): {top}"))
    calls = f"{s.calls} ({s.calls_without_logprobs} without logprobs"
    if s.content_null_calls:
        calls += f", {s.content_null_calls} with null content"
    if s.unfinished_calls:  # paid for, though their episodes are not (yet) in the run directory
        calls += f", {s.unfinished_calls} by episodes not finished"
    rows.append(("model calls", f"{calls}); {s.retries} retries; "
                                f"{s.rate_text()}; tokens {s.prompt_tokens:,} prompt + {s.completion_tokens:,} "
                                f"completion; {s.cost_text()}"))
    rows.append(("time", f"{duration_text(s.elapsed_s())} this run"))
    rows += [("note", note) for note in summary.notes]
    return rows


def summary_lines(summary) -> list[str]:
    """The run summary printed on stdout (``uqh run``): :func:`summary_rows`, labels in a 15-column field."""
    return [f"{label:<15}{text}" for label, text in summary_rows(summary)]


def next_hint(run_dir: Path) -> str:
    """What to do with a finished run: score it, then the report and the DataFrame export (commands that work as
    printed, from the same working directory)."""
    q = shlex.quote
    base = str(run_dir).rstrip("/")
    return (f"next           uqh score {q(base)}   (then: uqh report {q(base)} --out {q(base + '-report')}; "
            f"uqh export {q(base)} --to {q(base + '-export')})")


def execution_text(prepared: PreparedRun) -> str:
    """The dry run's execution line: concurrency, where the episodes run, the per-call limits."""
    batch = prepared.settings.batch
    if prepared.backend.name == "ray":
        actors = f"{batch.workers} actors" if batch.workers else "one actor per CPU"
        where = f"backend ray at {batch.ray_address or 'a local instance'}, {actors}"
    else:
        where = f"workers {batch.workers or 1}"
    return (f"concurrency {prepared.concurrency}, {where}; per call: timeout {batch.client.timeout_s:g} s, "
            f"{batch.client.max_retries} retries")


def run(args: argparse.Namespace) -> int:
    # the write path (runner, backends, model client) is imported only to run: `uqh run --help` stays fast
    from uqh.harness.launch import execute, prepare

    if args.list_options:
        print(_list_options(args), end="")
        return 0
    settings = settings_from_args(args)  # every flag is checked here, before any plan or run
    if args.dry_run and args.preset:  # a preset (or group) plan
        print(plan(args.preset, overrides=settings.run), end="")
        return 0
    prepared = prepare(settings)
    note = tasks_note(prepared.config, prepared.requested_tasks)
    if args.dry_run:
        stopping = _stopping_text(prepared.config) if prepared.config.consensus_stopping is not None else ""
        print(run_plan(prepared.config, prepared.out, note=note, execution=execution_text(prepared),
                       stopping=stopping), end="")
        return 0
    if note:
        print(f"uqh run: note: {note}", file=sys.stderr)
    return render_result(execute(prepared))


def render_result(result: RunResult) -> int:
    """Print the run's summary (stdout) and why it stopped (stderr); the exit code."""
    summary, config = result.summary, result.config
    print("\n".join(summary_lines(summary)), flush=True)
    print_endpoint_lines(summary)
    s = summary.stats
    if config.consensus_stopping is not None:
        print(f"sequential     {summary.skipped}/{summary.planned} samples skipped "
              f"({summary.skipped / max(summary.planned, 1):.1%} saved; {_stopping_text(config)}; "
              "skipped_samples.jsonl)")
    if summary.stopped is not None:
        cause = summary.stopped
        print(f"uqh run: {cause.message}; {summary.remaining} episodes not finished; {cause.hint}", file=sys.stderr)
        return cause.exit_code
    if not summary.ok:
        reasons = "; ".join(f"{m} (x{n})" for m, n in s.error_messages.most_common(3)) or "interrupted"
        print(
            f"uqh run: {summary.remaining} episodes not finished ({reasons}); "
            "re-run the same command to resume",
            file=sys.stderr,
        )
        return 1
    if summary.finished_before + s.done:
        print(next_hint(result.run_dir))
    return 0
