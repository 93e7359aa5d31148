"""The paper's run configurations as data (Appendix K, Tables 15-16).

A :class:`Preset` is a typed partial :class:`uqh.rundir.schema.RunConfig` (same field names) plus metadata (name,
description, the paper's task count, the run directory). ``uqh run --preset NAME`` resolves it with the command
line's overrides through :func:`uqh.harness.config.build.resolve_config`; ``--dry-run`` prints :func:`uqh.harness.config.plan.plan` (the same
:func:`uqh.harness.config.build.draft`, then the domain asked offline for its tasks) and calls no model. Every preset value
can be overridden on the command line (the model especially: ``--model``).

Shared decoding (Table 15): temperature 0.2, top_p 1.0, top_logprobs 5, max completion tokens 64,000,
reasoning enabled, seed 42. Per dataset (Table 16 and Appendix G): StrategyQA full split, budget 16,
top-k 3; HotpotQA 2,000 fullwiki validation questions, budget 7, top-k 5; Tau2 base split of
airline/retail/telecom, budget 50, environment cap 120, user simulator Qwen 2.5 7B Instruct; WebShop
500 tasks over the 1,000-product catalog, budget 30, human goals when ``items_human_ins.json`` is there, else
synthetic ones (``goal_source=auto``: the manifest records which, the report says so; ``-D goal_source=human``
requires the file). Observations are cut to 420 characters everywhere.

This module imports nothing heavy: listing and planning must work offline and fast.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from uqh.rundir.errors import UserError
from uqh.rundir.schema import DecodingConfig

PAPER_MODEL = "openrouter/google/gemma-4-31b-it"
PAPER_USER_MODEL = "openrouter/qwen/qwen-2.5-7b-instruct"
PAPER_SEED = 42
OBSERVATION_CHARS = 420

#: Table 15, shared by every dataset. Keys are :class:`uqh.rundir.schema.DecodingConfig` fields.
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


#: Preset name -> preset. ``uqh run --preset`` resolves one with the command line's overrides (uqh.harness.config.build).
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
        domain_options={"n_products": 1_000, "goal_source": "auto"},
        expected_tasks=500,
        description="WebShop, the original's test split (first 500 shuffled human goals; synthetic goals, "
        "labelled so, when the data has no items_human_ins.json) over the 1,000-product catalog, budget 30",
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


