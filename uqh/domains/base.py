"""What a domain (benchmark) provides to the harness.

A :class:`Domain` knows its tasks and system prompt and builds one :class:`Environment` per episode.
An environment knows nothing about models, files or concurrency: the loop sends it actions and it
answers with observations, and it can be *replayed* to a recorded prefix (for continuations and
mid-episode crash recovery).
"""
from __future__ import annotations

import abc
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypedDict

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from uqh.rundir.errors import UserError, require_extra
from uqh.rundir.schema import DecodingConfig, Episode, StopReason

from uqh.prompts import PROMPTS_DIR
from uqh.domains.tool_offer import BracketTool, ToolOffer


class InvalidAction(Exception):
    """The action is outside the domain's grammar or not possible in the current state.

    The environment state must be unchanged when this is raised. The message is shown to the model
    in a repair request, so it must say precisely what was wrong and what is allowed.
    """


class EnvironmentUnavailable(Exception):
    """The environment could not answer for a reason outside the episode (e.g. the simulated user's model
    endpoint failed after retries): an infrastructure failure, not an outcome. The episode is not written and a
    resumed run re-queues it."""


class ReplayMismatch(Exception):
    """Replaying a recorded prefix produced a different observation than the one recorded."""


@dataclass
class EnvResponse:
    observation: str
    done: bool = False
    outcome: int | None = None  # Y in {0, 1} when done with a clean label
    reward: float | None = None
    reward_info: dict[str, Any] = field(default_factory=dict)
    # When done without a clean label (Tau2 only): env_terminated or tool_error.
    stop_reason: StopReason | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class RecordedStep:
    """What replay needs from one recorded step."""

    action: str
    observation: str
    info: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------- domain options


def _no_bool(value: Any) -> Any:
    # pydantic's lax int accepts True as 1; an option given as `true` where a count is expected is a mistake.
    if isinstance(value, bool):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


#: Option types shared by the domains; :func:`option_error` words their errors ("a positive integer").
PositiveInt = Annotated[int, Field(gt=0), BeforeValidator(_no_bool)]
NonNegativeInt = Annotated[int, Field(ge=0), BeforeValidator(_no_bool)]


def option_field(default: Any = None, *, description: str, flag: str | None = None,
                 path: Literal["input", "cache"] | None = None) -> Any:
    """A domain option field. ``flag``: the `uqh run` flag that is an alias of the option (named in its errors);
    ``path``: the value is a filesystem path, made absolute by the build layer -- ``input`` must exist, ``cache``
    is a directory created on demand."""
    extra: dict[str, Any] = {}
    if flag:
        extra["flag"] = flag
    if path:
        extra["path"] = path
    return Field(default, description=description, json_schema_extra=extra or None)


class DomainOptions(BaseModel):
    """A domain's options (``RunConfig.domain_options``), validated when the domain is built.

    Subclasses declare every option as a field with a description and a default; unknown keys are refused.
    ``RunConfig.domain_options`` keeps only the options that were set explicitly (defaults stay out of the config
    hash, so adding an option with a default does not change the hash of existing run directories).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    split: str | None = option_field(
        description="dataset split: a run setting (RunConfig.split), given with --split, not -D", flag="--split")

    @classmethod
    def path_kinds(cls) -> dict[str, str]:
        """Option name -> ``input`` / ``cache`` for the options that are filesystem paths."""
        return {name: (f.json_schema_extra or {})["path"] for name, f in cls.model_fields.items()
                if isinstance(f.json_schema_extra, dict) and "path" in f.json_schema_extra}

    @classmethod
    def label(cls, key: str, domain: str) -> str:
        """How errors name an option: its `uqh run` flag when it has one, else ``<domain> option <key>``."""
        f = cls.model_fields.get(key)
        extra = f.json_schema_extra if f is not None and isinstance(f.json_schema_extra, dict) else {}
        return extra.get("flag") or f"{domain} option {key}"


def _expected(options_cls: type[DomainOptions], key: str, error: dict[str, Any]) -> str:
    """What a valid value of option ``key`` is, in words, read from the options' JSON schema."""
    if error["type"] == "literal_error":
        return error["ctx"]["expected"]
    prop = options_cls.model_json_schema()["properties"].get(key, {})
    kinds = [k for k in prop.get("anyOf", [prop]) if k.get("type") != "null"]
    if len(kinds) == 1:
        kind = kinds[0]
        if kind.get("type") == "integer":
            if kind.get("exclusiveMinimum") == 0:
                return "a positive integer"
            return f"an integer >= {kind['minimum']}" if "minimum" in kind else "an integer"
        if kind.get("type") == "boolean":
            return "true or false"
    msg = error["msg"]
    return msg[len("Input should be "):] if msg.startswith("Input should be ") else msg


def option_error(domain: str, options_cls: type[DomainOptions], exc: ValidationError, template: str) -> str:
    """One line for a ValidationError of domain options: the unknown keys and the known ones (``template``), or
    the first bad value and what it must be."""
    errors = exc.errors()
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        return template.format(domain=domain, unknown=", ".join(unknown), known=", ".join(options_cls.model_fields))
    error = errors[0]
    if error["type"] == "value_error":  # a model validator's own message (e.g. options that need each other)
        return str(error["ctx"]["error"])
    key = str(error["loc"][0]) if error["loc"] else ""
    return f"{options_cls.label(key, domain)} must be {_expected(options_cls, key, error)}, got {error['input']!r}"


class Runtime(TypedDict, total=False):
    """Run-time facts the runner hands to :meth:`Domain.prepare_runtime` (not part of the config hash)."""

    run_dir: Path
    #: a resolved litellm model string of the simulated user (e.g. a local:smollm2 server on a free port)
    user_model: str
    user_api_base: str | None
    user_decoding: DecodingConfig | None
    #: the per-call timeout of the simulated user's model calls (the run's --timeout)
    user_timeout_s: float
    #: top alternatives per token the simulated user's model is asked for (RunConfig.user_logprobs); absent: none
    user_logprobs: int


class Environment(abc.ABC):
    """One episode's environment."""

    @abc.abstractmethod
    async def reset(self) -> str:
        """Start the episode; return the first user message (task statement + initial observation)."""

    @abc.abstractmethod
    async def step(self, action: str) -> EnvResponse:
        """Apply the content of the <action> tag. Raise InvalidAction (state unchanged) to ask for a repair."""

    async def replay(self, steps: list[RecordedStep]) -> None:
        """Bring a freshly reset environment to the state after ``steps``.

        The default re-executes every action and compares observations; domains whose steps call
        other models (Tau2's user simulator) override this to restore state from the record.
        """
        for i, rec in enumerate(steps, start=1):
            resp = await self.step(rec.action)
            if resp.observation != rec.observation:
                raise ReplayMismatch(
                    f"step {i}: replayed observation differs from the recorded one "
                    f"(recorded {rec.observation[:80]!r}, replayed {resp.observation[:80]!r})"
                )
            if resp.done:
                raise ReplayMismatch(f"step {i}: the episode ended during replay; the prefix is not censored")

    async def restore(self, task_prompt: str, steps: list[RecordedStep]) -> None:
        """Open the episode at the state after ``steps``, recorded after ``task_prompt`` (a resumed checkpoint, a
        continuation branch's prefix).

        The default resets, then replays; when the default :meth:`replay` re-executes the actions, the reset's task
        prompt must be the recorded one. A domain whose reset calls a model (Tau2's simulated user's opening turn)
        overrides this to restore from the record alone, which holds that turn.
        """
        reset_prompt = await self.reset()
        await self.replay(steps)
        # A replay that restores state from the record validates the recorded conversation itself.
        if reset_prompt != task_prompt and type(self).replay is Environment.replay:
            raise ReplayMismatch("the reset environment's task prompt differs from the recorded one")

    def take_user_logprobs(self) -> list[Any]:
        """The provider's raw ``choices[0].logprobs`` of each simulated-user model call made since the last take, in
        call order (None for a call that returned none), and forget them. The loop converts them, as it converts the
        agent's, into the user sidecar's rows. Default: no simulated user, nothing."""
        return []

    def close(self) -> None:
        """Release resources (override if needed)."""


class Domain(abc.ABC):
    """A benchmark: its tasks, its prompt, and a factory for environments."""

    name: ClassVar[str]
    #: how tables and reports name the benchmark (recorded in the manifest); None: the domain's name
    display_name: ClassVar[str | None] = None
    #: the system prompt's file: beside the domain's own module (a plugin's folder), else in uqh/prompts/ (where
    #: uqh's built-in domains keep the paper's Appendix K prompts together)
    prompt_file: ClassVar[str]
    default_step_budget: ClassVar[int]
    default_split: ClassVar[str | None] = None
    #: The splits ``--split`` may name (an unknown one is refused before anything is recorded); None: the domain's
    #: data decides (tau2, webshop check their own).
    splits: ClassVar[tuple[str, ...] | None] = None
    supports_replay: ClassVar[bool] = True
    #: GBNF rule body for the <action> field used with ``--grammar`` (llama.cpp servers): it constrains the
    #: action to the domain's tool syntax so a small local model yields actions the environment can run.
    #: None keeps the generic length-capped free-text rule of ``uqh/prompts/four_tags.gbnf``.
    action_gbnf: ClassVar[str | None] = None
    #: The observation cut `uqh run` records when --observation-chars is not given; None for a domain that shows
    #: observations whole (it ignores ``observation_chars``), so the manifest says what the domain does.
    default_observation_chars: ClassVar[int | None] = 420
    #: The domain's options: ``domain_options`` are validated against it when the domain is built.
    Options: ClassVar[type[DomainOptions]] = DomainOptions
    #: How an unknown option is reported (``{domain}``, ``{unknown}``, ``{known}``).
    unknown_options_message: ClassVar[str] = "unknown {domain} option(s) {unknown}; known: {known}"
    #: `uqh run` refuses to start without --user-model (the domain simulates a user with a model).
    needs_user_model: ClassVar[bool] = False
    #: The :class:`Runtime` keys the domain reads (from :meth:`prepare_runtime`) besides ``run_dir``.
    runtime_keys: ClassVar[frozenset[str]] = frozenset()
    #: Modules the `--workers` fork server imports once for this domain (what each worker would otherwise load on
    #: first use, e.g. Tau2's package and its parsed databases).
    worker_preload: ClassVar[tuple[str, ...]] = ()
    #: ``uqh run --agent tools``: the domain's actions as tools, and what the agent is told about the task (empty:
    #: the domain offers no tools; a domain whose tools are not bracket actions overrides :meth:`tool_offer`).
    bracket_tools: ClassVar[tuple[BracketTool, ...]] = ()
    tool_instructions: ClassVar[str] = ""
    #: ``(extra, module)``: the uqh extra the domain needs and the package that extra installs; None: the core.
    required_extra: ClassVar[tuple[str, str] | None] = None

    @classmethod
    def check_installed(cls) -> None:
        """UserError (one line: which extra to install) when the domain needs an extra that is missing; checked
        when a command names the domain and when it is built, before any work."""
        if cls.required_extra is not None:
            require_extra(*cls.required_extra, f"the {cls.name} domain")

    def __init__(self, options: dict[str, Any] | None = None, *, observation_chars: int | None = 420):
        self.check_installed()
        self.options: dict[str, Any] = dict(options or {})
        self.settings = self.parse_options(self.options)
        self.observation_chars = observation_chars
        self.runtime: Runtime = {}

    @classmethod
    def parse_options(cls, options: dict[str, Any]) -> DomainOptions:
        """The typed options (defaults filled in) from a ``domain_options`` dict; a None value means unset.
        Raises UserError (one line) for an unknown key or a bad value."""
        given = {k: v for k, v in options.items() if v is not None}
        try:
            return cls.Options.model_validate(given)
        except ValidationError as exc:
            raise UserError(option_error(cls.name, cls.Options, exc, cls.unknown_options_message)) from None

    @abc.abstractmethod
    def all_task_ids(self) -> list[str]:
        """Every task id of the configured split, in the benchmark's canonical order."""

    def select_task_ids(self, n: int | None, seed: int) -> list[str]:
        """The first ``n`` tasks (domains that sample, like HotpotQA, override this deterministically)."""
        ids = self.all_task_ids()
        return ids if n is None else ids[:n]

    def system_prompt(self) -> str:
        return self.prompt_path().read_text()

    @classmethod
    def prompt_path(cls) -> Path:
        module_file = getattr(sys.modules.get(cls.__module__), "__file__", None)  # None: a class made in code
        beside = Path(module_file).parent / cls.prompt_file if module_file else None
        return beside if beside is not None and beside.is_file() else PROMPTS_DIR / cls.prompt_file

    @classmethod
    def dataset_label(cls) -> str:
        return cls.display_name or cls.name

    def tool_offer(self) -> ToolOffer:
        """The domain's actions as native tools (``uqh run --agent tools``); UserError when it offers none."""
        if not self.bracket_tools:
            raise UserError(f"the {self.name} domain offers no tools; run it with --agent react")
        return ToolOffer(list(self.bracket_tools), self.tool_instructions)

    @abc.abstractmethod
    def make_env(self, task_id: str, *, episode_seed: int) -> Environment:
        """A fresh environment for one episode of ``task_id``."""

    def prepare_runtime(self, runtime: Runtime) -> None:
        """Receive run-time facts that are not part of the config hash (:class:`Runtime`), before any env is
        made; the keys a domain reads are its ``runtime_keys``."""
        self.runtime = Runtime(**runtime)

    async def aclose(self) -> None:
        """Release what the domain bound to the running event loop (e.g. HTTP sessions); the runner calls it once
        the episodes on that loop are done. Default: nothing to release."""

    def manifest_info(self) -> dict[str, Any]:
        """Extra facts for the manifest (corpus, goals file hash, data source...)."""
        return {}

    def recorded_info(self) -> dict[str, Any]:
        """What the manifest's ``info`` records: the benchmark's display name, then :meth:`manifest_info`."""
        return {"display_name": self.dataset_label(), **self.manifest_info()}

    def load_data(self) -> None:
        """Load now what episodes would load on first use (task lists, catalogs, indexes), so that a copy of this
        instance carries it: the Ray backend pickles the domain once into its object store and every worker
        unpickles it, instead of each reading the data from its own disk. Default: :meth:`all_task_ids`."""
        self.all_task_ids()

    def __getstate__(self) -> dict[str, Any]:
        """A pickled domain (Ray backend) carries its options and loaded data, not its run-time facts: the
        process that unpickles it calls :meth:`prepare_runtime` itself. Domains holding locks, thread pools or
        connections drop them here and make them again on use."""
        state = dict(self.__dict__)
        state["runtime"] = {}
        return state

    def truncate(self, text: str) -> str:
        if self.observation_chars is None or len(text) <= self.observation_chars:
            return text
        return text[: self.observation_chars]

    @classmethod
    def canonical_answer(cls, episode: Episode) -> str | None:
        """The canonical class of the episode's final answer (Mouzouni, "Black-box reliability certification", Definition 4.1): equal strings for answers
        that mean the same thing, so that self-consistency counts agreement, not surface form. None is the one
        explicit "no answer" class: an episode that gave no final answer (max_steps, parse_error, an ending
        without a clean label). Computed from the recorded episode alone (no data, no environment), so a run
        directory can be re-canonicalised at any time. Domains that support `uqh certify` override this."""
        raise NotImplementedError(f"the {cls.name} domain has no canonical answer (Domain.canonical_answer)")

    @classmethod
    def has_canonical_answer(cls) -> bool:
        return cls.canonical_answer.__func__ is not Domain.canonical_answer.__func__


def clean_final_action(episode: Episode) -> str | None:
    """The last action of an episode that ended with a clean label (the action that ended it), else None: what
    the canonicalisers of the Finish-style domains start from."""
    if episode.stop_reason != StopReason.clean or not episode.steps:
        return None
    return episode.steps[-1].action
