"""The paper's run configurations as data (Appendix K, Tables 15-16), and the dry-run plan for each.

A :class:`Preset` is a typed partial :class:`rundir.schema.RunConfig` (same field names) plus metadata (name,
description, the paper's task count, the run directory). ``uqh run --preset NAME`` resolves it with the command
line's overrides through :func:`harness.build.resolve_config`; ``--dry-run`` prints :func:`plan` (the same
:func:`harness.build.draft`, then the domain asked offline for its tasks) and calls no model. Every preset value
can be overridden on the command line (the model especially: ``--model``).

Shared decoding (Table 15): temperature 0.2, top_p 1.0, top_logprobs 5, max completion tokens 64,000,
reasoning enabled, seed 42. Per dataset (Table 16 and Appendix G): StrategyQA full split, budget 16,
top-k 3; HotpotQA 2,000 fullwiki validation questions, budget 7, top-k 5; Tau2 base split of
airline/retail/telecom, budget 50, environment cap 120, user simulator Qwen 2.5 7B Instruct; WebShop
500 tasks over the 1,000-product catalog, budget 30. Observations are cut to 420 characters everywhere.

This module imports nothing heavy: listing and planning must work offline and fast.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from rundir.errors import UserError
from rundir.schema import DecodingConfig, RunConfig

if TYPE_CHECKING:
    from harness.build import RunOverrides

PAPER_MODEL = "openrouter/google/gemma-4-31b-it"
PAPER_USER_MODEL = "openrouter/qwen/qwen-2.5-7b-instruct"
PAPER_SEED = 42
OBSERVATION_CHARS = 420
MAX_REPAIRS = 2  # Appendix K: up to two repair attempts per step

#: Table 15, shared by every dataset. Keys are :class:`rundir.schema.DecodingConfig` fields.
PAPER_DECODING: dict[str, Any] = {
    "temperature": 0.2,
    "top_p": 1.0,
    "logprobs": True,
    "top_logprobs": 5,
    "seed": PAPER_SEED,
    "max_tokens": 64_000,
    "reasoning": True,
}

#: The user simulator of Tau2 is part of the environment, not the scored agent; it needs no logprobs.
PAPER_USER_DECODING: dict[str, Any] = {
    "temperature": 0.2,
    "top_p": 1.0,
    "logprobs": False,
    "top_logprobs": 0,
    "seed": PAPER_SEED,
    "max_tokens": 2_048,
    "reasoning": False,
}


class Preset(BaseModel):
    """A paper run configuration: the RunConfig fields it sets (same names and types) and its metadata."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    expected_tasks: int = Field(description="the paper's task count, used when the domain cannot list tasks offline")
    out: str = Field(description="run directory (relative to the working directory)")
    domain: str
    split: str | None = None
    n_tasks: int | None = Field(description="the first/sampled N tasks; None: every task of the split")
    samples_per_task: int = 1
    model: str = PAPER_MODEL
    api_base: str | None = None
    decoding: DecodingConfig = Field(description="only the fields set here override the defaults")
    step_budget: int
    observation_chars: int | None = OBSERVATION_CHARS
    domain_options: dict[str, Any] = {}
    user_model: str | None = None
    user_decoding: DecodingConfig | None = None
    user_api_base: str | None = None


def _preset(
    name: str,
    *,
    domain: str,
    n_tasks: int | None,
    step_budget: int,
    description: str,
    split: str | None = None,
    domain_options: dict[str, Any] | None = None,
    user_model: str | None = None,
    expected_tasks: int,
) -> Preset:
    return Preset(
        name=name,
        description=description,
        expected_tasks=expected_tasks,
        out=f"runs/paper-{domain}",
        domain=domain,
        split=split,
        n_tasks=n_tasks,
        decoding=DecodingConfig(**PAPER_DECODING),
        step_budget=step_budget,
        domain_options=dict(domain_options or {}),
        user_model=user_model,
        user_decoding=DecodingConfig(**PAPER_USER_DECODING) if user_model else None,
    )


#: Preset name -> preset. ``uqh run --preset`` resolves one with the command line's overrides (harness.build).
PRESETS: dict[str, Preset] = {
    "paper-strategyqa": _preset(
        "paper-strategyqa",
        domain="strategyqa",
        n_tasks=None,
        step_budget=16,
        domain_options={"top_k": 3},
        expected_tasks=2_290,
        description="StrategyQA, full wics/strategy-qa test split (2,290 questions), budget 16, top-k 3",
    ),
    "paper-hotpotqa": _preset(
        "paper-hotpotqa",
        domain="hotpotqa",
        n_tasks=2_000,
        step_budget=7,
        domain_options={"top_k": 5},
        expected_tasks=2_000,
        description="HotpotQA, 2,000 fullwiki validation questions (seed-42 sample), budget 7, top-k 5",
    ),
    **{
        f"paper-tau2-{d}": _preset(
            f"paper-tau2-{d}",
            domain=f"tau2-{d}",
            split="base",
            n_tasks=None,
            step_budget=50,
            domain_options={"max_hops": 120},
            user_model=PAPER_USER_MODEL,
            expected_tasks=n,
            description=f"Tau2-Bench {d}, base split ({n} tasks), budget 50, env cap 120, user Qwen 2.5 7B Instruct",
        )
        for d, n in (("airline", 50), ("retail", 114), ("telecom", 114))
    },
    "paper-webshop": _preset(
        "paper-webshop",
        domain="webshop",
        n_tasks=500,
        step_budget=30,
        domain_options={"n_products": 1_000, "goal_source": "human"},
        expected_tasks=500,
        description="WebShop, the original's test split (first 500 shuffled human goals) over the 1,000-product "
        "catalog, budget 30",
    ),
}

#: Groups: a name that expands to several presets (run one after another).
PRESET_GROUPS: dict[str, list[str]] = {
    "paper-tau2": ["paper-tau2-airline", "paper-tau2-retail", "paper-tau2-telecom"],
    "paper-all": [
        "paper-strategyqa",
        "paper-hotpotqa",
        "paper-tau2-airline",
        "paper-tau2-retail",
        "paper-tau2-telecom",
        "paper-webshop",
    ],
}

# --------------------------------------------------------------------------------------- rough token model
#: Assumptions of the rough token budget, printed with every plan.
CHARS_PER_TOKEN = 4.0
STEP_OUTPUT_TOKENS = 200  # one <think>/<action>/<confidence>/<explanation> step, reasoning excluded
TASK_PROMPT_TOKENS = 150  # question / instruction plus first observation


def preset_names() -> list[str]:
    return sorted(PRESETS) + sorted(PRESET_GROUPS)


def get_preset(name: str) -> Preset:
    """The preset (a deep copy: its option dicts are safe to modify)."""
    try:
        return PRESETS[name].model_copy(deep=True)
    except KeyError:
        hint = f" (a group: run each of {', '.join(PRESET_GROUPS[name])})" if name in PRESET_GROUPS else ""
        raise UserError(f"unknown preset {name!r}{hint}; choose one of: {', '.join(sorted(PRESETS))}") from None


def expand(name: str) -> list[str]:
    """A preset or group name -> the preset names it stands for."""
    if name in PRESET_GROUPS:
        return list(PRESET_GROUPS[name])
    get_preset(name)  # raises UserError for unknown names
    return [name]


def _prompt_chars(domain: str) -> tuple[int | None, str]:
    base = "tau2" if domain.startswith("tau2") else domain
    path = Path(__file__).resolve().parent.parent / "prompts" / f"{base}.txt"
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

    Tasks and prompt are asked of the domain (built by :func:`harness.build.build_domain`) when it can list them
    offline, else the configured count (or the paper's) is used. Cached per process (a group plan lists every
    domain once).
    """
    key = f"{config.model_dump_json()}|{n_tasks}|{expected_tasks}"
    if key not in _INSPECTED:
        _INSPECTED[key] = _inspect_domain_uncached(config, n_tasks, expected_tasks)
    return _INSPECTED[key]


def _inspect_domain_uncached(config: RunConfig, n_tasks: int | None, expected_tasks: int) -> tuple[int, str, int | None]:
    from harness.build import build_domain

    try:
        with _offline_datasets():
            dom = build_domain(config)
            ids = dom.select_task_ids(n_tasks, config.decoding.seed)
    except Exception as exc:  # a domain that is not built yet or needs data that is not local
        msg = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        count = n_tasks if n_tasks is not None else expected_tasks
        return count, f"as configured; the domain could not list tasks offline: {msg}", None
    try:
        prompt_chars: int | None = len(dom.system_prompt())
    except Exception:
        prompt_chars = None
    return len(ids), "listed by the domain", prompt_chars


def estimate(config: RunConfig, n_tasks: int, prompt_chars: int | None) -> dict[str, Any]:
    """Upper bounds of calls and prompt/completion tokens for a run of ``config`` over ``n_tasks`` tasks.

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
    return {
        "episodes": episodes,
        "calls_max": episodes * budget,
        "calls_max_with_repairs": episodes * budget * (1 + MAX_REPAIRS),
        "system_prompt_tokens": sys_tokens,
        "prompt_tokens": episodes * per_episode_prompt,
        "completion_tokens": episodes * budget * STEP_OUTPUT_TOKENS,
        "completion_tokens_cap": episodes * budget * (config.decoding.max_tokens or 0),
    }


def dollar_estimate(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """USD for these tokens at litellm's price map (the copy bundled with litellm: ``LITELLM_LOCAL_MODEL_COST_MAP``,
    no network); None when the map has no price for ``model`` (a ``local:`` model, most OpenAI-compatible servers,
    some OpenRouter models). Imports litellm only for a model the map lists."""
    if model.startswith("local:"):
        return None
    from harness.model_client import cost_usd
    from rundir.schema import Usage

    return cost_usd(model, Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens))


def dollar_text(usd: float | None, model: str) -> str:
    """``~$12.34 at litellm's prices for MODEL (rough upper bound)`` or ``unpriced (...)``."""
    if usd is None:
        why = "a local model" if model.startswith("local:") else f"litellm's price map has no {model}"
        return f"unpriced ({why}; cost is recorded per call where the provider reports it)"
    amount = f"{usd:,.2f}" if usd >= 1 else f"{usd:.4f}"
    return f"~${amount} at litellm's prices for {model} (for the prompt + output tokens above)"


def estimate_rows(config: RunConfig, est: dict[str, Any], prompt_src: str) -> list[tuple[str, str]]:
    """(label, text) of the calls, tokens and cost lines of a plan (``uqh run --dry-run`` and the preset plan);
    sets ``est["usd"]`` (None: unpriced)."""
    usd = dollar_estimate(config.model, est["prompt_tokens"], est["completion_tokens"])
    est["usd"] = usd
    return [
        ("model calls", f"<= {est['calls_max']:,} (tasks x samples x budget); "
                        f"<= {est['calls_max_with_repairs']:,} with {MAX_REPAIRS} repairs per step"),
        ("prompt tokens", f"~{est['prompt_tokens']:,} upper bound (system prompt ~{est['system_prompt_tokens']:,} "
                          f"tokens, resent every call; measured on {prompt_src})"),
        ("output tokens", f"~{est['completion_tokens']:,} at {STEP_OUTPUT_TOKENS}/step without reasoning; "
                          f"hard cap {est['completion_tokens_cap']:,} (max_tokens x calls)"),
        ("cost", dollar_text(usd, config.model)),
    ]


def plan(preset_name: str, *, overrides: RunOverrides | None = None) -> str:
    """The exact plan of a preset (or preset group) as text, with the command line's overrides applied as
    ``uqh run`` applies them (:func:`harness.build.draft`). Calls no model and opens no connection."""
    from harness.build import RunOverrides, draft

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
            totals[k] += est[k]
        dec = cfg.decoding
        asked = wanted if wanted is not None else preset.expected_tasks
        lines = [
            f"preset {name}: {preset.description}",
            f"  domain          {cfg.domain}" + (f" (split {cfg.split})" if cfg.split else ""),
            f"  tasks           {n_tasks:,} ({source}) x {cfg.samples_per_task} sample(s) = {est['episodes']:,} episodes",
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
        if est["usd"] is None:
            unpriced.append(name)
        else:
            usd_total += est["usd"]
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
    """``python -m harness.presets [NAME...]``: print the dry-run plan (default: every paper preset)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m harness.presets", description="print the dry-run plan of presets")
    p.add_argument("names", nargs="*", default=["paper-all"], help=f"presets or groups: {', '.join(preset_names())}")
    p.add_argument("--model", default=None, help="override the agent model (litellm string)")
    args = p.parse_args(argv)
    from harness.build import RunOverrides

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
