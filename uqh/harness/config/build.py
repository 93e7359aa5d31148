"""The build layer: a preset plus command-line overrides -> a :class:`RunConfig`; a RunConfig -> the domain
instance and the model client it runs with.

``uqh run`` (and its ``--dry-run``), the preset plan (:func:`uqh.harness.config.plan.plan`) and the batch runner all go
through here, so a flag means the same thing everywhere. Nothing here writes: :func:`resolve_config` reads the
domain's data, the environment (API keys) and an existing run directory's manifest (the resume check), and raises
:class:`uqh.rundir.errors.UserError` with one line for anything the user can fix.

Two steps: :func:`draft` merges preset and overrides and checks everything that needs no I/O (the preset plan
stops there and asks the domain for its tasks offline); :func:`resolve_config` then checks the run directory, the
model strings and keys, builds the domain, selects the tasks and fingerprints the system prompt.
"""
from __future__ import annotations

import hashlib
import logging
import math
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from uqh.harness.config.presets import Preset
from uqh.harness.config.settings import (
    AT_LEAST_ONE,
    AT_LEAST_ZERO,
    SEED,
    TOP_LOGPROBS,
    ClientSettings,
    DecodingOverrides,
    RunOverrides,
)
from uqh.harness.model.llama_server import ServedModel
from uqh.rundir.errors import UserError, not_utf8
from uqh.rundir.reader import is_run_dir
from uqh.rundir.schema import DEFAULT_AGENT, DecodingConfig, RunConfig
from uqh.rundir.secrets import mask_url, url_credentials

if TYPE_CHECKING:
    from uqh.domains.base import Domain

log = logging.getLogger(__name__)

#: Default max_tokens for local: models without the grammar (``--no-grammar``; CPU-bound, ~13 tokens/s with
#: logprobs; a 135M model's output past a few sentences is noise). API models keep the schema default (512)
#: unless --max-tokens is given.
LOCAL_MAX_TOKENS = 160
#: Local models decode with the grammar by default: the four capped fields plus tags need up to ~210 tokens; a
#: smaller cap would cut every step.
LOCAL_GRAMMAR_MAX_TOKENS = 256
#: A local user simulator (Tau2 ``--user-model local:...``) without a preset's user decoding: tau2's own user
#: settings (temperature 0, seed offset 0) plus this completion cap -- a user turn is a sentence or two, and an
#: uncapped 135M model can ramble to its context limit on every turn.
LOCAL_USER_MAX_TOKENS = 128


@dataclass(frozen=True)
class Draft:
    """A run before its domain is built: the config without tasks and prompt hash, and how tasks are chosen."""

    config: RunConfig  # task_ids == [] and prompt_sha256 == "" until resolve_config fills them in
    task_ids: list[str] | None  # explicit ids (--task-ids), else None
    n_tasks: int | None  # otherwise the first/sampled N (None: every task of the split)
    out: Path


# --------------------------------------------------------------------------------------- checks


def prompt_sha256(text: str) -> str:
    """The system prompt's hash, recorded in the config (a run refuses to resume under a changed prompt)."""
    return hashlib.sha256(text.encode()).hexdigest()


def check_positive(name: str, value: int | None, minimum: int = 1) -> None:
    """UserError ``NAME must be >= minimum, got VALUE`` unless ``value`` is None."""
    {0: AT_LEAST_ZERO, 1: AT_LEAST_ONE}[minimum].check(name, value)


def check_provider_ranges(dec: DecodingOverrides) -> None:
    """UserError for a ``--top-logprobs`` or ``--seed`` outside what providers take."""
    TOP_LOGPROBS.check("--top-logprobs", dec.top_logprobs)
    SEED.check("--seed", dec.seed)


def check_endpoint_url(flag: str, url: str | None) -> None:
    """UserError unless ``url`` (None: not given) is an http(s) URL with a host and without credentials.

    Credentials in a URL (``http://user:password@host/v1``, ``...?api_key=KEY``, ``...;api_key=KEY``, ``#KEY``)
    would be written to the manifest and printed, and the clients refuse them next to their own Authorization
    header; every message shows the URL masked (:func:`uqh.rundir.secrets.mask_url`).
    """
    if url is None:
        return
    found = url_credentials(url)
    if found is not None:
        raise UserError(
            f"{flag} {mask_url(url)} contains {found}; it would be written to the run's manifest: "
            f"give the URL without it and the key in OPENAI_API_KEY (environment or .env)"
        )
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"{flag} {mask_url(url)!r} is not an http(s) URL with a host; give e.g. "
                        "http://127.0.0.1:8000/v1")


def check_endpoint_list(urls: list[str] | None) -> None:
    """UserError unless every URL of a multi-endpoint list is a usable endpoint and none is given twice."""
    for url in urls or ():
        check_endpoint_url("--api-base", url)
    if urls and len(set(urls)) != len(urls):
        twice = next(u for u in urls if urls.count(u) > 1)
        raise UserError(f"--api-base {twice} is given twice; list each endpoint once")


def endpoint_overrides(api_bases: list[str] | None, endpoints_file: str | Path | None) -> dict[str, Any]:
    """``api_base`` / ``api_bases`` of :class:`RunOverrides` from repeated ``--api-base`` and ``--endpoints FILE``
    (one URL per line; blank lines and ``#`` comments skipped): one endpoint sets ``api_base`` as before, two or
    more set ``api_bases`` too (``api_base`` being the first)."""
    urls = list(api_bases or [])
    if endpoints_file is not None:
        path = Path(endpoints_file)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as exc:
            raise not_utf8(f"--endpoints {path}", exc) from None
        except OSError as exc:
            raise UserError(f"--endpoints {path}: {exc.strerror or exc}; give a file with one endpoint URL per line")
        found = [ln.split("#", 1)[0].strip() for ln in lines]
        found = [u for u in found if u]
        if not found:
            raise UserError(f"--endpoints {path} lists no endpoint; give one URL per line")
        urls += found
    if not urls:
        return {}
    check_endpoint_list(urls)
    return {"api_base": urls[0], "api_bases": urls if len(urls) > 1 else None}


def validate_model_string(model: str, api_base: str | None, *, flag: str = "--api-base") -> None:
    """Raise UserError for a model string litellm cannot route (no network), or ``flag`` given with a local model."""
    from uqh.harness.model.llama_server import check_model_string

    check_model_string(model)
    if model.startswith("local:") and api_base is not None:
        raise UserError(f"{flag} cannot be combined with {model}; the local server picks its own address")


def observation_chars_for(cls: type[Domain], flag: int | None, preset_value: int | None) -> int | None:
    """The observation cut to record: --observation-chars; else, for a domain that cuts, the preset's value or the
    domain's default (420); None for a domain whose ``default_observation_chars`` is None (it shows observations
    whole, e.g. WebShop pages, Tau2 tool JSON), so the manifest says what the domain does."""
    if flag is not None:
        return flag
    if cls.default_observation_chars is None:
        return None
    return preset_value or cls.default_observation_chars


# --------------------------------------------------------------------------------------- domain options


def check_option_urls(cls: type[Domain], options: dict[str, Any]) -> None:
    """UserError (the URL masked) for a domain option whose value is a URL with credentials (``-D es_url=``,
    ``-D user_api_base=``): options are recorded in the manifest, so a key there would be written to it."""
    for key, value in options.items():
        if isinstance(value, str) and "://" in value:
            found = url_credentials(value)
            if found is not None:
                raise UserError(f"{cls.Options.label(key, cls.name)} {mask_url(value)} contains {found}; it would be "
                                "written to the run's manifest: give the URL without it and the key in the environment")


def domain_options_for(cls: type[Domain], preset_options: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``RunConfig.domain_options``: the preset's options updated by the command line's, validated by the domain's
    ``Options`` and normalised (``"3"`` for an integer option is recorded as 3, so a flag and ``-D`` with the same
    value make the same run). Only explicitly set options are recorded: defaults stay out of the config hash.
    Path options are made absolute; input paths must exist, a cache directory must be a directory if it exists."""
    if "split" in given:
        raise UserError("the split is a run setting: use --split NAME, not a domain option")
    options = {**preset_options, **given}
    check_option_urls(cls, options)
    if given.get("retrieval") == "es" and not options.get("es_url"):
        raise UserError("--retrieval es needs --es-url URL (and usually --es-index NAME)")
    settings = cls.parse_options(options).model_dump(mode="json")
    recorded = {key: (settings[key] if options[key] is not None else None) for key in options}
    paths = cls.Options.path_kinds()
    for key in paths.keys() & given.keys():  # relative to where the command was given
        if recorded[key] is not None:
            recorded[key] = str(Path(recorded[key]).resolve())
    for key, kind in paths.items():
        value = recorded.get(key)
        if value is None:
            continue
        label = cls.Options.label(key, cls.name)
        if kind == "input" and not Path(value).exists():
            raise UserError(f"{label} {value} does not exist")
        if kind == "cache" and Path(value).exists() and not Path(value).is_dir():
            raise UserError(f"{label} {value} is not a directory; pass a directory for the index")
    return recorded


# --------------------------------------------------------------------------------------- presets + overrides


def agent_for(name: str | None, decoding: dict[str, Any]) -> str:
    """The run's agent (default react). The tools agent decodes without the four-tag grammar (the provider's own
    tool-call format applies), so ``--grammar`` with it is refused and a local model's default grammar is off."""
    from uqh.harness.episode.agent_registry import check_agent

    agent = check_agent(name or DEFAULT_AGENT)
    if agent != DEFAULT_AGENT:
        if decoding.get("grammar"):
            raise UserError("--grammar forces the react agent's four tags; it cannot be used with --agent tools")
        decoding["grammar"] = False
    return agent


@dataclass(frozen=True)
class _Models:
    """The agent's and the simulated user's models and endpoints of a draft."""

    model: str
    api_base: str | None
    api_bases: list[str] | None
    user_model: str | None
    user_api_base: str | None


def draft(preset: Preset | None, overrides: RunOverrides) -> Draft:
    """Merge ``preset`` and ``overrides`` (flags win) and check what needs no I/O. Raises UserError.

    One merge-and-check per RunConfig field, in field order (the models and the decoding in helpers, called in that
    order), so the first mistake of a command line is the one reported."""
    from uqh.domains.domain_registry import get_domain_class
    from uqh import __version__

    domain_name = overrides.domain or (preset.domain if preset else None)
    if not domain_name:
        raise UserError("give --domain NAME (or --preset NAME)")
    if preset and overrides.domain and overrides.domain != preset.domain:
        raise UserError(f"--domain {overrides.domain} contradicts --preset {preset.name} (domain {preset.domain})")
    cls = get_domain_class(domain_name)
    cls.check_installed()
    dec = overrides.decoding
    for name, value in (("--tasks", overrides.tasks), ("--samples", overrides.samples),
                        ("--step-budget", overrides.step_budget), ("--max-tokens", dec.max_tokens)):
        check_positive(name, value)
    check_positive("--observation-chars", overrides.observation_chars, 1)
    check_provider_ranges(dec)
    if overrides.split is not None and cls.splits is not None and overrides.split not in cls.splits:
        known = f"use one of {', '.join(cls.splits)}" if cls.splits else "it has none; leave --split out"
        raise UserError(f"unknown --split {overrides.split!r} for {cls.name}: {known}")
    out = run_dir_of(preset, overrides)
    models = _models_of(cls, domain_name, preset, overrides)
    decoding_cfg, agent = _decoding_of(preset, overrides, models.model)
    domain_options = domain_options_for(cls, preset.domain_options if preset else {}, overrides.domain_options)
    task_ids, n_tasks = _tasks_of(preset, overrides)
    if overrides.user_logprobs and not cls.needs_user_model:
        raise UserError(f"--user-logprobs needs a domain with a simulated user (tau2-airline, tau2-retail, "
                        f"tau2-telecom); {domain_name} has none")
    user_decoding = preset.user_decoding if preset and models.user_model else None
    # a preset's user decoding is its API user model's (2,048 tokens); a local one gets the local cap
    if models.user_model and models.user_model.startswith("local:"):
        user_decoding = local_user_decoding()
    samples = overrides.samples or (preset.samples_per_task if preset else None) or 1
    config = RunConfig(
        domain=domain_name,
        split=overrides.split or (preset.split if preset else None),
        task_ids=[],
        samples_per_task=samples,
        model=models.model,
        api_base=models.api_base,
        api_bases=models.api_bases,
        decoding=decoding_cfg,
        step_budget=overrides.step_budget or (preset.step_budget if preset else None) or cls.default_step_budget,
        observation_chars=observation_chars_for(cls, overrides.observation_chars,
                                                preset.observation_chars if preset else None),
        domain_options=domain_options,
        user_model=models.user_model,
        user_decoding=user_decoding,
        user_api_base=models.user_api_base,
        user_logprobs=decoding_cfg.top_logprobs if overrides.user_logprobs else None,
        prompt_sha256="",
        package_version=__version__,
        consensus_stopping=consensus_stopping_for(cls, overrides, samples),
        agent=agent,
    )
    return Draft(config=config, task_ids=task_ids, n_tasks=n_tasks, out=out)


def _models_of(cls: type[Domain], domain_name: str, preset: Preset | None, overrides: RunOverrides) -> _Models:
    """The agent's and the user's models and endpoints (flags over the preset), checked."""
    from uqh.harness.model.llama_server import default_model

    model = overrides.model or (preset.model if preset else None) or default_model()
    api_base = overrides.api_base if overrides.api_base is not None else (preset.api_base if preset else None)
    user_model = overrides.user_model or (preset.user_model if preset else None)
    user_api_base = overrides.user_api_base if overrides.user_api_base is not None else (
        preset.user_api_base if preset else None)
    check_endpoint_url("--api-base", api_base)
    check_endpoint_list(overrides.api_bases)
    api_bases = overrides.api_bases if overrides.api_bases and len(overrides.api_bases) > 1 else None
    if api_bases and api_base != api_bases[0]:
        raise ValueError("RunOverrides.api_base must be the first of api_bases")
    check_endpoint_url("--user-api-base", user_api_base)
    if user_api_base is not None and not user_model:
        raise UserError("--user-api-base needs --user-model (the user-simulator model served there)")
    if overrides.user_model and not cls.needs_user_model:  # it would enter the config hash and change nothing
        raise UserError(f"--user-model needs a domain with a simulated user (tau2-airline, tau2-retail, tau2-telecom); "
                        f"{domain_name} has none: leave --user-model out")
    if not user_model and cls.needs_user_model:
        raise UserError(f"{domain_name} needs a user-simulator model: pass --user-model (e.g. --user-model local:smollm2)")
    return _Models(model, api_base, api_bases, user_model, user_api_base)


def _decoding_of(preset: Preset | None, overrides: RunOverrides, model: str) -> tuple[DecodingConfig, str]:
    """The decoding (flags over the preset; a local model's grammar and cap) and the agent, checked."""
    dec = overrides.decoding
    decoding: dict[str, Any] = preset.decoding.model_dump(exclude_unset=True) if preset else {}
    decoding.update(dec.model_dump(exclude_none=True))
    agent = agent_for(overrides.agent, decoding)
    if model.startswith("local:"):  # a tiny local model only produces parsed steps with the grammar's help
        decoding.setdefault("grammar", True)
        decoding.setdefault("max_tokens", LOCAL_GRAMMAR_MAX_TOKENS if decoding["grammar"] else LOCAL_MAX_TOKENS)
    if dec.temperature is not None and not math.isfinite(dec.temperature):  # nan would be recorded as null
        raise UserError(f"--temperature must be a finite number, got {dec.temperature}")
    if dec.temperature is not None and dec.temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {dec.temperature}")
    if dec.top_p is not None and not 0 < dec.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {dec.top_p}")
    return DecodingConfig(**decoding), agent


def _tasks_of(preset: Preset | None, overrides: RunOverrides) -> tuple[list[str] | None, int | None]:
    """(explicit task ids, else None; else how many tasks to select)."""
    if overrides.task_ids is not None:
        return list(overrides.task_ids), None
    if overrides.tasks is not None:
        return None, overrides.tasks
    if preset:
        return None, preset.n_tasks
    raise UserError("choose the tasks: --tasks N or --task-ids A,B")


def local_user_decoding() -> DecodingConfig:
    """The recorded user decoding of a local user simulator: tau2's user defaults (temperature 0, no logprobs,
    seed offset 0) with :data:`LOCAL_USER_MAX_TOKENS` as the cap."""
    return DecodingConfig(temperature=0.0, top_p=1.0, logprobs=False, top_logprobs=0, seed=0,
                          max_tokens=LOCAL_USER_MAX_TOKENS)


def consensus_stopping_for(cls: type[Domain], overrides: RunOverrides, samples: int):
    """``RunConfig.consensus_stopping`` of ``--stop-on-consensus DELTA [--stop-rule RULE]`` (None without it)."""
    from uqh.harness.sampling.consensus import RULES
    from uqh.rundir.schema import ConsensusStopping

    if overrides.stop_on_consensus is None:
        if overrides.stop_rule is not None:
            raise UserError("--stop-rule needs --stop-on-consensus DELTA")
        return None
    delta = overrides.stop_on_consensus
    if not 0 < delta < 1:
        raise UserError(f"--stop-on-consensus must be in (0, 1) (the certificate's error level), got {delta}")
    rule = overrides.stop_rule or "anytime"
    if rule not in RULES:
        raise UserError(f"unknown --stop-rule {rule!r}; use one of {', '.join(RULES)}")
    if samples < 2:
        raise UserError("--stop-on-consensus needs --samples K with K >= 2 (it stops a task's samples early)")
    if not cls.has_canonical_answer():
        raise UserError(f"--stop-on-consensus needs canonical answers, which the {cls.name} domain does not define")
    return ConsensusStopping(rule=rule, delta=delta)


def resolve_config(preset: Preset | None, overrides: RunOverrides) -> RunConfig:
    """The RunConfig of ``uqh run`` for a preset (or None) and the command line's overrides.

    Checks, in order, everything :func:`draft` checks, the run directory (``--out``: new, empty, or a run), the
    model strings and API keys, the domain (it is built, its tasks listed) and, when the run directory holds a run,
    that its config is this one (resume). Raises UserError; writes nothing.
    """
    from uqh.harness.config.build import prompt_sha256
    from uqh.harness.store.writer import check_out_dir, check_resumable
    from uqh.harness.episode.agent_registry import agent_system_prompt

    d = draft(preset, overrides)
    check_out_dir(d.out)
    config = d.config
    validate_model_string(config.model, config.api_base)
    if config.user_model:
        validate_model_string(config.user_model, config.user_api_base, flag="--user-api-base")
    preflight(config)
    try:
        domain = build_domain(config)
        task_ids = select_tasks(domain, d)
        system_prompt = agent_system_prompt(domain, config.agent)
    except UserError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else repr(exc)
        raise UserError(f"cannot load the {config.domain} domain: {first}") from None
    if not task_ids:
        raise UserError(f"no tasks selected for {config.domain}")
    config = config.model_copy(update={"task_ids": task_ids, "prompt_sha256": prompt_sha256(system_prompt)})
    if is_run_dir(d.out):
        check_resumable(d.out, config)
    return config


def preflight(config: RunConfig, *, check_keys: bool = True) -> None:
    """UserError, offline, for what would otherwise fail only once the batch has started: a ``local:`` model's
    model file or ``llama-server`` binary, and (``check_keys``) an API model's key.
    Run by :func:`resolve_config` before the domain loads its data, and again by the runner before it creates
    the run directory (a library call or ``uqh continue`` may not have resolved a config here)."""
    from uqh.harness.model.llama_server import LOCAL_MODELS, check_credentials, check_local_model

    for model, api_base in ((config.model, config.api_base), (config.user_model, config.user_api_base)):
        if model in LOCAL_MODELS:
            check_local_model(model)  # the GGUF (package or cache) and llama-server, each naming uqh setup local
        elif model and check_keys:
            check_credentials(model, api_base)


def run_dir_of(preset: Preset | None, overrides: RunOverrides) -> Path:
    """The run directory of ``uqh run``: --out, else the preset's."""
    out = overrides.out or (Path(preset.out) if preset else None)
    if not out:
        raise UserError("give --out DIR (the run directory to create or resume)")
    return Path(out)


def select_tasks(domain: Domain, d: Draft) -> list[str]:
    """The task ids of a draft: the explicit ids (each must be one of the domain's, none twice), else the domain's
    selection of ``n_tasks`` under the run seed."""
    if d.task_ids is None:
        return list(domain.select_task_ids(d.n_tasks, d.config.decoding.seed))
    known = set(domain.all_task_ids())
    unknown = [t for t in d.task_ids if t not in known]
    if unknown:
        raise UserError(f"unknown task ids for {d.config.domain}: {', '.join(unknown[:5])}")
    if len(set(d.task_ids)) != len(d.task_ids):
        raise UserError("--task-ids lists a task twice; use --samples K for repeated episodes")
    return list(d.task_ids)


# --------------------------------------------------------------------------------------- config -> objects


def build_domain(config: RunConfig) -> Domain:
    """The configured domain instance (options = domain_options, plus ``split`` when the config sets one); its
    ``Options`` validate the options (UserError for an unknown key or a bad value)."""
    from uqh.domains.domain_registry import get_domain_class

    cls = get_domain_class(config.domain)
    options = dict(config.domain_options)
    if config.split is not None:
        options.setdefault("split", config.split)
    return cls(options, observation_chars=config.observation_chars)


def build_client(config: RunConfig, served: ServedModel, client: ClientSettings,
                 client_factory: Callable[[str, str | None], Any] | None = None):
    """The model client for the run's agent: ``served``, its model as resolved (a local: model's server; several
    endpoints to spread the calls over, :mod:`uqh.harness.model.endpoints`), the run's decoding and, with
    ``--grammar``, the domain's action grammar; ``client``: per-call timeout, retries and the circuit breaker, as the run was given
    them. ``client_factory(model, api_base)`` replaces :func:`uqh.harness.model.client.make_model_client` (tests)."""
    if client_factory is not None:
        return client_factory(served.model, served.api_base)
    from uqh.domains.domain_registry import get_domain_class
    from uqh.harness.model.client import make_model_client

    action_grammar = get_domain_class(config.domain).action_gbnf if config.decoding.grammar else None
    several = len(served.api_bases) > 1
    made = make_model_client(
        served.model, api_base=served.api_base, decoding=config.decoding, action_grammar=action_grammar,
        timeout_s=client.timeout_s, max_retries=client.max_retries, breaker_failures=client.breaker_failures,
        breaker_window_s=client.breaker_window_s,
        **({"api_bases": list(served.api_bases), "endpoint_capacity": served.slots} if several else {}))
    where = ", ".join(served.api_bases) if several else served.api_base or "the provider's API"
    log.info("agent model %s at %s (%s transport, grammar %s)", served.model, where,
             type(made.transport).__name__, "on" if action_grammar else "off")
    return made
