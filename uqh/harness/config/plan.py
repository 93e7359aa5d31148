"""The dry-run plan of a run or a preset: what would run (domain, tasks, budgets) and a rough token and dollar
estimate, computed offline without calling a model (``uqh run --dry-run``, ``python -m uqh.harness.config.plan``)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
import math
import os
import sys


from uqh.harness.config.build import RunOverrides, build_domain, draft
from uqh.harness.episode.agent_registry import agent_system_prompt
from uqh.harness.episode.loop import MAX_REPAIRS
from uqh.harness.config.presets import expand, get_preset, preset_names
from uqh.harness.model.pricing import cost_usd
from uqh.prompts import PROMPTS_DIR
from uqh.rundir.errors import UserError
from uqh.rundir.schema import RunConfig, Usage

#: Assumptions of the rough token budget, printed with every plan.
CHARS_PER_TOKEN = 4.0
STEP_OUTPUT_TOKENS = 200  # one <think>/<action>/<confidence>/<explanation> step, reasoning excluded
TASK_PROMPT_TOKENS = 150  # question / instruction plus first observation


def _prompt_chars(domain: str) -> tuple[int | None, str]:
    base = "tau2" if domain.startswith("tau2") else domain
    path = PROMPTS_DIR / f"{base}.txt"
    if path.exists():
        return len(path.read_text()), str(path.relative_to(path.parent.parent))
    return None, f"prompts/{base}.txt (missing)"


@contextlib.contextmanager
def _offline_datasets():
    """Forbid Hugging Face hub downloads while a domain lists its tasks (the dry run must not touch the network)."""
    keys = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: "1" for k in keys})
    ds_config = sys.modules.get("datasets.config")
    saved_flag = getattr(ds_config, "HF_HUB_OFFLINE", None) if ds_config else None
    if ds_config is not None:
        ds_config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if ds_config is not None:
            ds_config.HF_HUB_OFFLINE = saved_flag


_INSPECTED: dict[str, tuple[int, str, int | None]] = {}


def _inspect_domain(config: RunConfig, n_tasks: int | None, expected_tasks: int) -> tuple[int, str, int | None]:
    """(tasks, where the count comes from, system prompt chars or None).

    Tasks and prompt are asked of the domain (built by :func:`uqh.harness.config.build.build_domain`) when it can list them
    offline, else the configured count (or the paper's) is used. Cached per process (a group plan lists every
    domain once).
    """
    key = f"{config.model_dump_json()}|{n_tasks}|{expected_tasks}"
    if key not in _INSPECTED:
        _INSPECTED[key] = _inspect_domain_uncached(config, n_tasks, expected_tasks)
    return _INSPECTED[key]


def _inspect_domain_uncached(config: RunConfig, n_tasks: int | None, expected_tasks: int) -> tuple[int, str, int | None]:
    try:
        with _offline_datasets():
            dom = build_domain(config)
            ids = dom.select_task_ids(n_tasks, config.decoding.seed)
    except Exception as exc:  # a domain that is not built yet or needs data that is not local
        msg = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        count = n_tasks if n_tasks is not None else expected_tasks
        return count, f"as configured; the domain could not list tasks offline: {msg}", None
    try:
        prompt_chars: int | None = len(agent_system_prompt(dom, config.agent))
    except Exception:
        prompt_chars = None
    return len(ids), "listed by the domain", prompt_chars


@dataclass(frozen=True)
class RunEstimate:
    """Upper bounds of a planned run (:func:`estimate`)."""

    episodes: int
    calls_max: int
    calls_max_with_repairs: int
    system_prompt_tokens: int
    prompt_tokens: int
    completion_tokens: int
    completion_tokens_cap: int
    #: USD at litellm's price map for the prompt + completion tokens above (None: unpriced)
    usd: float | None


def estimate(config: RunConfig, n_tasks: int, prompt_chars: int | None) -> RunEstimate:
    """Upper bounds of calls, prompt/completion tokens and dollars for a run of ``config`` over ``n_tasks`` tasks.

    Calls: every episode uses at most ``step_budget`` steps, each step at most ``1 + MAX_REPAIRS`` calls.
    Prompt tokens of step t (no repairs): system + task + (t - 1) * (step output + observation); summed
    over t = 1..B that is B * (system + task) + B(B - 1)/2 * (step + observation).
    """
    episodes = n_tasks * config.samples_per_task
    budget = config.step_budget
    sys_tokens = math.ceil((prompt_chars or 0) / CHARS_PER_TOKEN)
    obs_tokens = math.ceil((config.observation_chars or 2_000) / CHARS_PER_TOKEN)
    per_episode_prompt = budget * (sys_tokens + TASK_PROMPT_TOKENS) + budget * (budget - 1) // 2 * (
        STEP_OUTPUT_TOKENS + obs_tokens
    )
    prompt_tokens = episodes * per_episode_prompt
    completion_tokens = episodes * budget * STEP_OUTPUT_TOKENS
    return RunEstimate(
        episodes=episodes, calls_max=episodes * budget, calls_max_with_repairs=episodes * budget * (1 + MAX_REPAIRS),
        system_prompt_tokens=sys_tokens, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
        completion_tokens_cap=episodes * budget * (config.decoding.max_tokens or 0),
        usd=dollar_estimate(config.model, prompt_tokens, completion_tokens),
    )


def dollar_estimate(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """USD for these tokens at litellm's price map (the copy bundled with litellm: ``LITELLM_LOCAL_MODEL_COST_MAP``,
    no network); None when the map has no price for ``model`` (a ``local:`` model, most OpenAI-compatible servers,
    some OpenRouter models). Imports litellm only for a model the map lists."""
    if model.startswith("local:"):
        return None
    return cost_usd(model, Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens))


def dollar_text(usd: float | None, model: str) -> str:
    """``~$12.34 at litellm's prices for MODEL (rough upper bound)`` or ``unpriced (...)``."""
    if usd is None:
        why = "a local model" if model.startswith("local:") else f"litellm's price map has no {model}"
        return f"unpriced ({why}; cost is recorded per call where the provider reports it)"
    amount = f"{usd:,.2f}" if usd >= 1 else f"{usd:.4f}"
    return f"~${amount} at litellm's prices for {model} (for the prompt + output tokens above)"


def estimate_rows(config: RunConfig, est: RunEstimate, prompt_src: str) -> list[tuple[str, str]]:
    """(label, text) of the calls, tokens and cost lines of a plan (``uqh run --dry-run`` and the preset plan)."""
    usd = est.usd
    return [
        ("model calls", f"<= {est.calls_max:,} (tasks x samples x budget); "
                        f"<= {est.calls_max_with_repairs:,} with {MAX_REPAIRS} repairs per step"),
        ("prompt tokens", f"~{est.prompt_tokens:,} upper bound (system prompt ~{est.system_prompt_tokens:,} "
                          f"tokens, resent every call; measured on {prompt_src})"),
        ("output tokens", f"~{est.completion_tokens:,} at {STEP_OUTPUT_TOKENS}/step without reasoning; "
                          f"hard cap {est.completion_tokens_cap:,} (max_tokens x calls)"),
        ("cost", dollar_text(usd, config.model)),
    ]


def run_plan(config: RunConfig, out, *, note: str | None, execution: str, stopping: str) -> str:
    """The dry-run plan of one resolved run (``uqh run --dry-run`` without a preset): what would run, where, and
    the rough token and dollar estimate. Calls no model."""
    d = config.decoding
    n_episodes = len(config.task_ids) * config.samples_per_task
    lines = [f"domain        {config.domain}" + (f" (split {config.split})" if config.split else ""),
             f"tasks         {len(config.task_ids)} x {config.samples_per_task} sample(s) = {n_episodes} episodes"]
    if note:
        lines.append(f"note          {note}")
    lines.append(f"task ids      {', '.join(config.task_ids[:5])}{' ...' if len(config.task_ids) > 5 else ''}")
    lines.append(f"model         {config.model}" + (f" via {', '.join(config.endpoints)}" if config.endpoints else ""))
    lines.append(f"agent         {config.agent}")
    if config.user_model:
        lines.append(f"user model    {config.user_model}"
                     + (f" via {config.user_api_base}" if config.user_api_base else ""))
    lines.append(f"decoding      temperature={d.temperature} top_p={d.top_p} logprobs={d.logprobs} "
                 f"top_logprobs={d.top_logprobs} max_tokens={d.max_tokens} seed={d.seed} grammar={d.grammar} "
                 f"reasoning={d.reasoning}")
    cut = (f"observations cut to {config.observation_chars} chars" if config.observation_chars is not None
           else "observations not cut")
    lines.append(f"step budget   {config.step_budget}; {cut}")
    if config.domain_options:
        lines.append("options       " + ", ".join(f"{k}={v}" for k, v in sorted(config.domain_options.items())))
    if config.consensus_stopping is not None:
        lines.append(f"sequential    {stopping}")
    lines.append(f"run dir       {out} (config hash {config.config_hash()[:12]})")
    lines.append(f"execution     {execution}")
    est = estimate(config, len(config.task_ids), len(agent_system_prompt(build_domain(config), config.agent)))
    lines += [f"{label:<14}{text}" for label, text in estimate_rows(config, est, "the domain's filled-in prompt")]
    lines.append("dry run: no model was called, nothing was written.")
    return "\n".join(lines) + "\n"


def plan(preset_name: str, *, overrides: RunOverrides | None = None) -> str:
    """The exact plan of a preset (or preset group) as text, with the command line's overrides applied as
    ``uqh run`` applies them (:func:`uqh.harness.config.build.draft`). Calls no model and opens no connection."""
    overrides = overrides or RunOverrides()
    blocks = []
    totals = {"episodes": 0, "calls_max": 0, "prompt_tokens": 0, "completion_tokens": 0}
    usd_total, unpriced = 0.0, []
    for name in expand(preset_name):
        preset = get_preset(name)
        d = draft(preset, overrides)
        cfg = d.config
        wanted = len(d.task_ids) if d.task_ids is not None else d.n_tasks
        n_tasks, source, dom_prompt_chars = _inspect_domain(cfg, wanted, preset.expected_tasks)
        prompt_chars, prompt_src = _prompt_chars(cfg.domain)
        if dom_prompt_chars is not None:
            prompt_chars, prompt_src = dom_prompt_chars, "the domain's filled-in prompt"
        est = estimate(cfg, n_tasks, prompt_chars)
        for k in totals:
            totals[k] += getattr(est, k)
        dec = cfg.decoding
        asked = wanted if wanted is not None else preset.expected_tasks
        lines = [
            f"preset {name}: {preset.description}",
            f"  domain          {cfg.domain}" + (f" (split {cfg.split})" if cfg.split else ""),
            f"  tasks           {n_tasks:,} ({source}) x {cfg.samples_per_task} sample(s) = {est.episodes:,} episodes",
            *(
                [f"  NOTE            {wanted or preset.expected_tasks:,} tasks asked for; the local data holds "
                 f"{n_tasks:,} (give the domain the full data through its `data` option)"]
                if n_tasks < asked
                else []
            ),
            f"  model           {cfg.model}" + (f" via {', '.join(cfg.endpoints)}" if cfg.endpoints else ""),
            "  decoding        "
            + ", ".join(f"{k}={getattr(dec, k)}" for k in ("temperature", "top_p", "top_logprobs", "max_tokens",
                                                           "reasoning", "seed")),
            f"  step budget     {cfg.step_budget}; "
            + (f"observations cut to {cfg.observation_chars} chars" if cfg.observation_chars is not None
               else "observations not cut"),
        ]
        if cfg.domain_options:
            lines.append("  domain options  " + ", ".join(f"{k}={v}" for k, v in cfg.domain_options.items()))
        if cfg.user_model:
            lines.append(f"  user simulator  {cfg.user_model} (environment, not scored; calls not counted below)")
        lines.append(f"  run directory   {d.out} (resumable: finished episodes are skipped)")
        lines += [f"  {label:<16}{text}" for label, text in estimate_rows(cfg, est, prompt_src)]
        if est.usd is None:
            unpriced.append(name)
        else:
            usd_total += est.usd
        blocks.append("\n".join(lines))
    priced = f"~${usd_total:,.2f}" if usd_total >= 1 else f"~${usd_total:.4f}"
    priced += (f" + {len(unpriced)} unpriced preset(s)" if unpriced else "")
    cost = "unpriced" if len(unpriced) == len(blocks) else priced
    footer = (
        f"total: {totals['episodes']:,} episodes, <= {totals['calls_max']:,} model calls, "
        f"~{totals['prompt_tokens']:,} prompt + ~{totals['completion_tokens']:,} output tokens, cost {cost} (rough "
        f"upper bounds: {CHARS_PER_TOKEN:g} chars/token, every episode runs its full budget; real runs stop "
        "earlier)\ndry run: no model was called."
    )
    return "\n\n".join(blocks + [footer]) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m uqh.harness.config.plan [NAME...]``: print the dry-run plan (default: every paper preset)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m uqh.harness.config.plan", description="print the dry-run plan of presets")
    p.add_argument("names", nargs="*", default=["paper-all"], help=f"presets or groups: {', '.join(preset_names())}")
    p.add_argument("--model", default=None, help="override the agent model (litellm string)")
    args = p.parse_args(argv)
    overrides = RunOverrides(model=args.model)
    try:
        for name in args.names:
            print(plan(name, overrides=overrides), end="")
    except UserError as exc:
        print(f"presets: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
