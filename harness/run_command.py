"""`uqh run`: run episodes of a domain into a run directory (resumable: re-run the same command to resume).

Everything is validated before anything is written: unknown domain/preset/model string, an unusable --out,
a missing API key, unknown task ids, or a config that differs from the run already in --out each give one
line on stderr and exit 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

#: Default --max-tokens for local: models (CPU-bound, ~13 tokens/s with logprobs; a 135M model's output past a
#: few sentences is noise). API models keep the schema default (512) unless --max-tokens is given.
LOCAL_MAX_TOKENS = 160
#: With --grammar the four capped fields plus tags need up to ~210 tokens; a smaller cap would cut every step.
LOCAL_GRAMMAR_MAX_TOKENS = 256

DOMAIN_OPTION_FLAGS = ("data", "retrieval", "es_url", "es_index", "top_k", "corpus", "index_dir")
#: Domain options that are paths, made absolute before they go into the config.
PATH_OPTIONS = ("data", "corpus", "index_dir")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to run")
    g.add_argument("--domain", help="domain name (arithmetic, strategyqa, hotpotqa, tau2-airline, ...)")
    g.add_argument("--preset", help="start from a paper preset (see harness/presets.py); flags override it")
    sel = g.add_mutually_exclusive_group()
    sel.add_argument("--tasks", type=int, metavar="N", help="the domain's first/sampled N tasks")
    sel.add_argument("--task-ids", metavar="A,B,...", help="comma-separated task ids")
    g.add_argument("--samples", type=int, metavar="K", help="episodes per task (default 1)")
    g.add_argument("--split", help="dataset split (domain default if omitted)")
    g.add_argument("--data", metavar="PATH", help="local data file for the domain")
    g.add_argument("--step-budget", type=int, metavar="B", help="max steps per episode (default: the domain's)")
    g.add_argument("--observation-chars", type=int, metavar="N",
                   help="cut observations to N chars (default: the domain's, 420; WebShop and Tau2 do not cut)")

    m = p.add_argument_group("model")
    m.add_argument("--model", help="litellm model string, openai/NAME with --api-base, or local:smollm2 (default)")
    m.add_argument("--api-base", metavar="URL", help="OpenAI-compatible endpoint for --model")
    m.add_argument("--user-model", metavar="M", help="user-simulator model (Tau2)")
    m.add_argument("--user-api-base", metavar="URL", help="OpenAI-compatible endpoint for --user-model (Tau2)")
    m.add_argument("--temperature", type=float)
    m.add_argument("--top-p", type=float)
    m.add_argument("--seed", type=int, help="run seed (default 42); per-episode seeds derive from it")
    m.add_argument("--max-tokens", type=int, help=f"completion cap (default 512; {LOCAL_MAX_TOKENS} for local: models)")
    m.add_argument("--top-logprobs", type=int)
    m.add_argument("--no-logprobs", action="store_true", help="do not request token logprobs")
    m.add_argument("--grammar", action="store_true", default=None, help="force the four-tag shape (llama.cpp GBNF)")
    m.add_argument("--reasoning", action="store_true", default=None, help="ask the provider to enable reasoning")

    r = p.add_argument_group("retrieval (QA domains)")
    r.add_argument("--retrieval", choices=["bm25", "es"])
    r.add_argument("--es-url")
    r.add_argument("--es-index")
    r.add_argument("--top-k", type=int)
    r.add_argument("--corpus", metavar="PATH")
    r.add_argument("--index-dir", metavar="DIR",
                   help="bm25s index directory (reused or built there; not part of the config hash)")

    x = p.add_argument_group("execution")
    x.add_argument("--out", metavar="DIR", help="run directory (created, or resumed if it holds this run)")
    x.add_argument("--concurrency", type=int, metavar="C", help="episodes in flight (default 8; 2 for local:)")
    x.add_argument("--workers", type=int, default=1, metavar="N", help="worker processes sharing --concurrency (default 1; use 2+ when one process is CPU-bound)")
    x.add_argument("--no-progress", action="store_true", help="no progress bar / lines")
    x.add_argument("--no-checkpoints", action="store_true", help="do not checkpoint in-flight episodes")
    x.add_argument("--dry-run", action="store_true", help="validate and print the plan; call no model, write nothing")


def _positive(name: str, value: int | None, minimum: int = 1) -> None:
    from rundir.errors import UserError

    if value is not None and value < minimum:
        raise UserError(f"{name} must be >= {minimum}, got {value}")


def validate_model_string(model: str, api_base: str | None, *, flag: str = "--api-base") -> None:
    """Raise UserError for a model string litellm cannot route (no network), or ``flag`` given with a local model."""
    from rundir.errors import UserError
    from harness.local_model import check_model_string

    check_model_string(model)
    if model.startswith("local:") and api_base is not None:
        raise UserError(f"{flag} cannot be combined with {model}; the local server picks its own address")


def observation_chars_for(cls, flag: int | None, preset: dict[str, Any]) -> int | None:
    """The observation cut to record: --observation-chars; else, for a domain that cuts, the preset's value or the
    domain's default (420); None for a domain whose ``default_observation_chars`` is None (it shows observations
    whole, e.g. WebShop pages, Tau2 tool JSON), so the manifest says what the domain does."""
    if flag is not None:
        return flag
    if cls.default_observation_chars is None:
        return None
    return preset.get("observation_chars") or cls.default_observation_chars


def build_config(args: argparse.Namespace):
    """(RunConfig, domain instance, out dir) from the arguments; raises UserError, writes nothing."""
    from domains import get_domain_class
    from harness import __version__
    from rundir.errors import UserError
    from harness.runner import build_domain, prompt_sha256
    from rundir.schema import DecodingConfig, RunConfig

    preset: dict[str, Any] = {}
    if args.preset:
        from harness.presets import get_preset

        preset = get_preset(args.preset)
    domain_name = args.domain or preset.get("domain")
    if not domain_name:
        raise UserError("give --domain NAME (or --preset NAME)")
    if preset and args.domain and args.domain != preset["domain"]:
        raise UserError(f"--domain {args.domain} contradicts --preset {args.preset} (domain {preset['domain']})")
    cls = get_domain_class(domain_name)
    for name in ("--tasks", "--samples", "--step-budget", "--max-tokens", "--concurrency", "--workers"):
        _positive(name, getattr(args, name[2:].replace("-", "_")))
    _positive("--top-logprobs", args.top_logprobs, 0)
    _positive("--observation-chars", args.observation_chars, 1)

    out = args.out or preset.get("out")
    if not out:
        raise UserError("give --out DIR (the run directory to create or resume)")
    out = Path(out)
    from harness.store import check_out_dir

    check_out_dir(out)

    from harness.local_model import check_credentials, default_model

    model = args.model or preset.get("model") or default_model()
    api_base = args.api_base if args.api_base is not None else preset.get("api_base")
    validate_model_string(model, api_base)
    check_credentials(model, api_base)
    user_model = args.user_model or preset.get("user_model")
    user_api_base = args.user_api_base if args.user_api_base is not None else preset.get("user_api_base")
    if user_api_base is not None and not user_model:
        raise UserError("--user-api-base needs --user-model (the user-simulator model served there)")
    if user_model:
        validate_model_string(user_model, user_api_base, flag="--user-api-base")
        check_credentials(user_model, user_api_base)
    elif getattr(cls, "needs_user_model", False):
        raise UserError(f"{domain_name} needs a user-simulator model: pass --user-model (e.g. --user-model local:smollm2)")

    decoding: dict[str, Any] = dict(preset.get("decoding") or {})
    for flag, key in (("temperature", "temperature"), ("top_p", "top_p"), ("seed", "seed"),
                      ("max_tokens", "max_tokens"), ("top_logprobs", "top_logprobs"),
                      ("grammar", "grammar"), ("reasoning", "reasoning")):
        value = getattr(args, flag)
        if value is not None:
            decoding[key] = value
    if args.no_logprobs:
        decoding["logprobs"] = False
    if model.startswith("local:") and "max_tokens" not in decoding:
        decoding["max_tokens"] = LOCAL_GRAMMAR_MAX_TOKENS if decoding.get("grammar") else LOCAL_MAX_TOKENS
    if args.temperature is not None and args.temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")
    decoding_cfg = DecodingConfig(**decoding)

    domain_options: dict[str, Any] = dict(preset.get("domain_options") or {})
    for key in DOMAIN_OPTION_FLAGS:
        value = getattr(args, key)
        if value is not None:
            domain_options[key] = str(Path(value).resolve()) if key in PATH_OPTIONS else value
    if args.retrieval == "es" and not (args.es_url or domain_options.get("es_url")):
        raise UserError("--retrieval es needs --es-url URL (and usually --es-index NAME)")
    for key in ("data", "corpus"):
        if key in domain_options and not Path(domain_options[key]).exists():
            raise UserError(f"--{key} {domain_options[key]} does not exist")
    if "index_dir" in domain_options and Path(domain_options["index_dir"]).exists() \
            and not Path(domain_options["index_dir"]).is_dir():
        raise UserError(f"--index-dir {domain_options['index_dir']} is not a directory; pass a directory for the index")

    split = args.split or preset.get("split")
    observation_chars = observation_chars_for(cls, args.observation_chars, preset)
    step_budget = args.step_budget or preset.get("step_budget") or cls.default_step_budget
    samples = args.samples or preset.get("samples_per_task") or 1
    seed = decoding_cfg.seed

    proto = RunConfig(
        domain=domain_name, split=split, task_ids=[], model=model, api_base=api_base, decoding=decoding_cfg,
        step_budget=step_budget, observation_chars=observation_chars, domain_options=domain_options,
        prompt_sha256="", package_version=__version__,
    )
    try:
        domain = build_domain(proto)
        if args.task_ids:
            wanted = [t.strip() for t in args.task_ids.split(",") if t.strip()]
            known = set(domain.all_task_ids())
            unknown = [t for t in wanted if t not in known]
            if unknown:
                raise UserError(f"unknown task ids for {domain_name}: {', '.join(unknown[:5])}")
            if len(set(wanted)) != len(wanted):
                raise UserError("--task-ids lists a task twice; use --samples K for repeated episodes")
            task_ids = wanted
        elif args.tasks is not None:
            task_ids = domain.select_task_ids(args.tasks, seed)
        elif preset:
            task_ids = domain.select_task_ids(preset.get("n_tasks"), seed)
        else:
            raise UserError("choose the tasks: --tasks N or --task-ids A,B")
        system_prompt = domain.system_prompt()
    except UserError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"cannot load the {domain_name} domain: {str(exc).splitlines()[0] if str(exc) else exc!r}")
    if not task_ids:
        raise UserError(f"no tasks selected for {domain_name}")
    user_decoding = None
    if user_model and preset.get("user_decoding"):
        user_decoding = DecodingConfig(**preset["user_decoding"])
    config = proto.model_copy(
        update={
            "task_ids": list(task_ids),
            "samples_per_task": samples,
            "prompt_sha256": prompt_sha256(system_prompt),
            "user_model": user_model,
            "user_decoding": user_decoding,
            "user_api_base": user_api_base,
        }
    )
    config = RunConfig.model_validate(config.model_dump())
    if (out / "manifest.json").exists():
        from harness.store import check_resumable

        check_resumable(out, config)
    return config, domain, out


def _preset_plan(args: argparse.Namespace) -> str:
    """``--preset NAME --dry-run``: the preset's offline plan (no key, no network needed), with flag overrides."""
    from harness.presets import get_preset, plan

    overrides: dict[str, Any] = {}
    for flag, key in (("model", "model"), ("api_base", "api_base"), ("step_budget", "step_budget"),
                      ("tasks", "n_tasks"), ("samples", "samples_per_task"), ("out", "out"),
                      ("observation_chars", "observation_chars"), ("split", "split"), ("user_model", "user_model")):
        value = getattr(args, flag)
        if value is not None:
            overrides[key] = value
    if args.task_ids:
        overrides["n_tasks"] = len([t for t in args.task_ids.split(",") if t.strip()])
    decoding = {k: getattr(args, k) for k in ("temperature", "top_p", "seed", "max_tokens", "top_logprobs",
                                              "grammar", "reasoning") if getattr(args, k) is not None}
    if decoding or args.no_logprobs:
        merged = dict(get_preset(args.preset)["decoding"], **decoding)
        if args.no_logprobs:
            merged["logprobs"] = False
        overrides["decoding"] = merged
    return plan(args.preset, overrides=overrides)


def run(args: argparse.Namespace) -> int:
    from harness.runner import default_concurrency, run_batch

    if args.dry_run and args.preset:
        print(_preset_plan(args), end="")
        return 0
    config, domain, out = build_config(args)
    concurrency = args.concurrency or default_concurrency(config.model)
    n_episodes = len(config.task_ids) * config.samples_per_task
    if args.dry_run:
        d = config.decoding
        print(f"domain        {config.domain}" + (f" (split {config.split})" if config.split else ""))
        print(f"tasks         {len(config.task_ids)} x {config.samples_per_task} sample(s) = {n_episodes} episodes")
        print(f"task ids      {', '.join(config.task_ids[:5])}{' ...' if len(config.task_ids) > 5 else ''}")
        print(f"model         {config.model}" + (f" via {config.api_base}" if config.api_base else ""))
        if config.user_model:
            print(f"user model    {config.user_model}" + (f" via {config.user_api_base}" if config.user_api_base else ""))
        print(f"decoding      temperature={d.temperature} top_p={d.top_p} logprobs={d.logprobs} "
              f"top_logprobs={d.top_logprobs} max_tokens={d.max_tokens} seed={d.seed} grammar={d.grammar} "
              f"reasoning={d.reasoning}")
        cut = (f"observations cut to {config.observation_chars} chars" if config.observation_chars is not None
               else "observations not cut")
        print(f"step budget   {config.step_budget}; {cut}")
        if config.domain_options:
            print("options       " + ", ".join(f"{k}={v}" for k, v in sorted(config.domain_options.items())))
        print(f"run dir       {out} (config hash {config.config_hash()[:12]})")
        print(f"execution     concurrency {concurrency}, workers {args.workers}")
        print(f"model calls   <= {n_episodes * config.step_budget * 3:,} (budget x 3 attempts per step)")
        print("dry run: no model was called, nothing was written.")
        return 0

    summary = run_batch(
        config,
        out,
        concurrency=concurrency,
        workers=args.workers,
        progress=not args.no_progress,
        checkpoints=not args.no_checkpoints,
    )
    s = summary.stats
    print(f"run directory  {summary.run_dir}")
    print(
        f"episodes       {summary.finished_before + s.done}/{summary.planned} finished "
        f"({s.done} this run, {summary.finished_before} before)"
    )
    if s.stop_reasons:
        print("stop reasons   " + ", ".join(f"{k}={v}" for k, v in sorted(s.stop_reasons.items())))
    print(
        f"model calls    {s.calls} ({s.calls_without_logprobs} without logprobs); tokens "
        f"{s.prompt_tokens:,} prompt + {s.completion_tokens:,} completion; {s.cost_text()}"
    )
    for note in summary.notes:
        print(f"note           {note}")
    if not summary.ok:
        reasons = "; ".join(f"{m} (x{n})" for m, n in s.error_messages.most_common(3)) or "interrupted"
        print(
            f"uqh run: {summary.remaining} episodes not finished ({reasons}); "
            "re-run the same command to resume",
            file=sys.stderr,
        )
        return 1
    return 0
