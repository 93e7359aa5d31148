"""The run-directory schema: the one contract between the harness, the scoring package and reports.

A run directory holds

- ``manifest.json``    -- :class:`Manifest`: the complete run config and its hash;
- ``episodes.jsonl``   -- one :class:`Episode` per line, written only when the episode has finished;
- ``logprobs.jsonl``   -- the sidecar: one :class:`LogprobRow` per model call (every attempt, repairs included);
- ``user_logprobs.jsonl`` -- the simulated user's sidecar (Tau2 with ``uqh run --user-logprobs``): one
  :class:`LogprobRow` per user-model call, ``t`` the agent step whose observation holds the user's turn (0: the
  user's opening turn, shown in the task prompt), ``attempt`` the call's index within that turn (a telecom user may
  call its own tools before it speaks), ``action_token_range`` null; absent in runs without the flag;
- ``checkpoints/``     -- one :class:`PartialEpisode` per in-flight episode, removed when the episode finishes;
- ``writer.lock``      -- the writer's lock file (who writes the directory now; never data);
- ``*.quarantine``     -- lines ``uqh repair`` moved out of a JSONL file because they were not valid records;

and a continuation run directory (``uqh continue``) also ``qz.jsonl`` (:mod:`uqh.rundir.qz_file`),
``skipped_prefixes.jsonl`` (:class:`SkippedPrefix`) and, for a sequential stop rule, ``stop_decisions.jsonl``
(:class:`StopDecision`); a run with sequential sampling (``uqh run --stop-on-consensus``) also
``skipped_samples.jsonl`` (:class:`SkippedSample`).

Every record carries ``schema_version``. Nothing outside :mod:`rundir` reads these files: every reader goes
through :class:`rundir.RunDir`, so that a torn last line from a crash is never mistaken for data and every part
of the project counts the same episodes.
"""
from __future__ import annotations

import hashlib
import json
import math
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

SCHEMA_VERSION = 1

MANIFEST_FILE = "manifest.json"
EPISODES_FILE = "episodes.jsonl"
SIDECAR_FILE = "logprobs.jsonl"
USER_SIDECAR_FILE = "user_logprobs.jsonl"
CHECKPOINT_DIR = "checkpoints"
#: The writer's lock file (``uqh.harness.store.lock``): flock-ed by the one process writing the directory.
LOCK_FILE = "writer.lock"
#: Suffix of the side file ``uqh repair`` moves invalid lines of a JSONL file to (``episodes.jsonl.quarantine``).
QUARANTINE_SUFFIX = ".quarantine"
#: Files of a continuation run directory (``uqh continue``).
QZ_FILE = "qz.jsonl"
SKIPPED_FILE = "skipped_prefixes.jsonl"
#: A run with sequential sampling (``uqh run --stop-on-consensus``): the planned samples it did not draw.
SKIPPED_SAMPLES_FILE = "skipped_samples.jsonl"
#: ``Episode.info`` key of the episode's canonical answer class (``Domain.canonical_answer``), recorded when the
#: episode finishes: a string, or null for the explicit "no answer" class. Absent in runs recorded before it.
CANONICAL_ANSWER_KEY = "canonical_answer"
STOP_FILE = "stop_decisions.jsonl"
#: ``Manifest.info`` key of a run imported from another harness's results (``uqh import``): where it came from
#: (source file, sha256, harness) and what the source lacks (no verbal confidence); absent in runs uqh recorded.
IMPORTED_FROM_KEY = "imported_from"
AUDIT_JSON = "audit.json"
AUDIT_MD = "audit.md"


class StopReason(str, Enum):
    """Why an episode ended. The only place the set of endings is defined."""

    clean = "clean"  # terminal outcome Y observed
    max_steps = "max_steps"  # administrative step budget spent without a terminal outcome (censored)
    parse_error = "parse_error"  # repairs exhausted on one step
    tool_error = "tool_error"  # Tau2: the episode ended on too many tool errors, no clean label
    env_terminated = "env_terminated"  # Tau2: transfer / out-of-scope / environment cap, no clean label


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=False)


# --------------------------------------------------------------------------------------- logprobs


#: the logprob capability tiers of a step (AgentUQ's tiers): a signal that needs top-k is missing below ``full``
FULL_LOGPROBS, SELECTED_ONLY, NO_LOGPROBS = "full", "selected_only", "none"
CAPABILITY_TIERS = (FULL_LOGPROBS, SELECTED_ONLY, NO_LOGPROBS)


class TopLogprob(_Record):
    token: Annotated[str, Field(description="Alternative token text.")]
    logprob: Annotated[float, Field(description="Natural-log probability of the alternative.")]


class TokenLogprob(_Record):
    token: Annotated[str, Field(description="Generated token text, exactly as the provider returned it.")]
    logprob: Annotated[float, Field(description="Natural-log probability of the generated token.")]
    top_logprobs: Annotated[
        list[TopLogprob],
        Field(description="Top alternatives at this position, sorted by logprob descending, at most top_logprobs."),
    ] = []


class LogprobRow(_Record):
    """One sidecar line: the token log-probabilities of one model call."""

    schema_version: int = SCHEMA_VERSION
    episode_id: Annotated[str, Field(description="Episode this call belongs to.")]
    t: Annotated[int, Field(description="Step index (1-based) the call was made for.")]
    attempt: Annotated[int, Field(description="0 for the first try of the step, 1..2 for repair attempts.")]
    accepted: Annotated[bool, Field(description="True if this attempt's output was parsed and became step t.")]
    tokens: Annotated[
        list[TokenLogprob] | None,
        Field(description="Every generated token with its logprob and top alternatives; null if the provider returned none."),
    ]
    action_token_range: Annotated[
        tuple[int, int] | None,
        Field(description="Half-open token index range [start, end) covering the <action> content; null if unknown."),
    ] = None

    @property
    def capability_tier(self) -> str:
        """What this call's logprobs allow (:data:`CAPABILITY_TIERS`): ``full`` (every token has its top-k
        alternatives), ``selected_only`` (chosen-token logprobs, top-k missing at some token) or ``none``."""
        if not self.tokens:
            return NO_LOGPROBS
        return FULL_LOGPROBS if all(t.top_logprobs for t in self.tokens) else SELECTED_ONLY

    @field_validator("tokens")
    @classmethod
    def _log_probabilities(cls, tokens: list[TokenLogprob] | None, info: ValidationInfo) -> list[TokenLogprob] | None:
        """Read from a run directory (a reader's context), a logprob that is NaN or above 0 (a probability above 1;
        1e-3 of slack for rounding) makes the call's tokens missing (as a provider without logprobs), noted -- never
        used. Written, the row keeps what the provider sent."""
        if not (isinstance(info.context, dict) and OUT_OF_RANGE in info.context):
            return tokens
        for tok in tokens or ():
            for value in (tok.logprob, *(alt.logprob for alt in tok.top_logprobs)):
                if not value <= MAX_LOGPROB:  # NaN fails too
                    return read_as_missing("token logprob", value, info)
        return tokens


# --------------------------------------------------------------------------------------- steps


def _is_none(value: Any) -> bool:
    return value is None


class Usage(_Record):
    """Token counts of one call as the provider reported them (null: not reported).

    ``prompt_tokens`` counts every prompt token, cached ones included (OpenAI's convention; litellm normalises
    Anthropic's to it). The cache fields were added after schema version 1 shipped: they are left out of the JSON
    while null, so older run directories and calls without cache information read and write as before.
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    cached_prompt_tokens: Annotated[
        int | None,
        Field(description="Prompt tokens read from the provider's prompt cache (OpenAI "
                          "usage.prompt_tokens_details.cached_tokens, Anthropic cache_read_input_tokens); included in "
                          "prompt_tokens; null when the provider does not say.", exclude_if=_is_none),
    ] = None
    cache_write_prompt_tokens: Annotated[
        int | None,
        Field(description="Prompt tokens written to the provider's prompt cache (Anthropic "
                          "cache_creation_input_tokens, billed above the input rate); included in prompt_tokens; null "
                          "when the provider does not say.", exclude_if=_is_none),
    ] = None

    @property
    def uncached_prompt_tokens(self) -> int | None:
        """Prompt tokens not read from the cache (cache writes included); None when prompt_tokens is unknown."""
        if self.prompt_tokens is None:
            return None
        return self.prompt_tokens - (self.cached_prompt_tokens or 0)


class CallRecord(_Record):
    """Accounting for one model call."""

    model: Annotated[str, Field(description="Model string the call was made with (litellm form).")]
    usage: Usage = Usage()
    cost_usd: Annotated[float | None, Field(description="Provider cost in USD; null when the model is unpriced.")] = None
    latency_s: Annotated[float, Field(description="Wall-clock seconds of the call, retries included.")] = 0.0
    retries: Annotated[int, Field(description="Transient failures retried before this call succeeded.")] = 0
    finish_reason: str | None = None
    seed: int | None = None
    has_logprobs: Annotated[bool, Field(description="Whether the provider returned token logprobs.")] = False
    content_null: Annotated[
        bool,
        Field(description="The provider answered this call with a null message content: a reasoning-only answer "
                          "(recorded as its text), or an answer with nothing at all, which is retried as the "
                          "provider's fault (counted in retries; the agent never sees it). Written "
                          "only when true, so records of ordinary calls keep their earlier form.",
              exclude_if=lambda v: v is False),
    ] = False


class ToolCallRecord(_Record):
    """One native function call of a model answer (``uqh run --agent tools``), as the provider sent it."""

    id: Annotated[str | None, Field(description="The provider's call id (sent back with the tool's result).")] = None
    name: str
    arguments: Annotated[str, Field(description="The arguments exactly as the provider sent them (a JSON text).")]


class Attempt(_Record):
    """One model call for a step: the raw text and, if it was rejected, why."""

    attempt: int
    raw_text: Annotated[str, Field(description="The full generated text the parser saw (--agent tools: the "
                                               "message content, the calls are in tool_calls).")]
    error: Annotated[
        str | None,
        Field(description="Why the output was rejected (the repair message sent back), or null if accepted."),
    ] = None
    call: CallRecord
    tool_calls: Annotated[
        list[ToolCallRecord] | None,
        Field(description="The answer's native function calls (--agent tools); absent for the react agent and for an "
                          "answer without calls.", exclude_if=_is_none),
    ] = None

    @property
    def text_with_calls(self) -> str:
        """The answer as text: its content, then one line per native call, ``name(arguments as sent)``. What a
        replay in text (probes, judges, the viewer) shows of a ``--agent tools`` turn, whose content is often empty;
        a react attempt (no calls) is its raw text unchanged."""
        if not self.tool_calls:
            return self.raw_text
        calls = [f"{c.name}({c.arguments})" for c in self.tool_calls]
        return "\n".join([self.raw_text.rstrip(), *calls] if self.raw_text.strip() else calls)


#: The largest token logprob read as such (a probability of at most e^0.001: rounding); above it, or NaN, a call's
#: tokens are read as missing.
MAX_LOGPROB = 1e-3

#: Key of the validation context (``model_validate_json(raw, context={OUT_OF_RANGE: []})``) under which a reader
#: collects ``(field, value)`` of every value read as missing because it is outside its documented range.
OUT_OF_RANGE = "out_of_range"


def read_as_missing(field: str, value: Any, info: ValidationInfo) -> None:
    """A recorded value outside its documented range (an edited or foreign line): read as missing (None), never
    clipped or used -- a ``verbal_confidence`` of 7.5 moved AUROC 0.500 -> 0.545 --, and noted for the reader
    that asked (:data:`OUT_OF_RANGE`), which says so in its reading notes (``uqh score``, ``uqh audit``)."""
    if isinstance(info.context, dict) and isinstance(info.context.get(OUT_OF_RANGE), list):
        info.context[OUT_OF_RANGE].append((field, value))
    return None


class Step(_Record):
    t: Annotated[int, Field(description="1-based step index.")]
    think: str
    action: str
    verbal_confidence: Annotated[
        float | None, Field(description="Parsed <confidence>, clipped to [0, 1]; null if not numeric. A value read outside "
                          "[0, 1] (or NaN) is read as null and noted.")
    ]
    confidence_raw: Annotated[str | None, Field(description="The <confidence> text before parsing.")] = None
    explanation: str
    observation: Annotated[str, Field(description="What the environment returned for the action (as shown to the model).")]
    repair_attempts: Annotated[int, Field(description="Number of repairs needed for this step (0..2).")] = 0
    attempts: Annotated[list[Attempt], Field(description="Every call made for this step, in order.")]
    info: Annotated[dict[str, Any], Field(description="Domain-specific step details.")] = {}

    @field_validator("verbal_confidence")
    @classmethod
    def _a_probability(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and not 0.0 <= value <= 1.0:  # NaN fails both comparisons
            return read_as_missing("verbal_confidence", value, info)
        return value


class Episode(_Record):
    schema_version: int = SCHEMA_VERSION
    episode_id: Annotated[str, Field(description="Stable id: '<task_id>#<sample_index>' (branches add '@b<k>').")]
    task_id: str
    sample_index: int = 0
    stop_reason: StopReason
    outcome: Annotated[int | None, Field(description="Y in {0,1} when stop_reason is clean, else null (another "
                                                     "value is read as null and noted).")] = None
    reward: Annotated[float | None, Field(description="Raw benchmark reward when observed (a non-finite one is "
                                                      "read as null and noted).")] = None
    reward_info: Annotated[dict[str, Any], Field(description="Domain reward breakdown (e.g. F1, tau2 checks).")] = {}
    n_steps: Annotated[int, Field(description="Number of completed (parsed) steps.")]
    step_budget: int
    seed: Annotated[int | None, Field(description="Per-episode decoding seed derived from the run seed.")] = None
    task_prompt: Annotated[str, Field(description="The first user message (task and initial observation).")]
    steps: list[Step]
    failed_step: Annotated[
        list[Attempt] | None,
        Field(description="For parse_error: the attempts of the step that could not be parsed."),
    ] = None
    source_episode_id: Annotated[
        str | None, Field(description="For continuation branches: the censored episode this branch continues.")
    ] = None
    branch_index: int | None = None
    prefix_steps: Annotated[
        int, Field(description="Steps copied from the source prefix (continuations; 0 otherwise).")
    ] = 0
    started_at: str | None = None
    finished_at: str | None = None
    info: dict[str, Any] = {}

    @field_validator("outcome")
    @classmethod
    def _zero_or_one(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value not in (0, 1):
            return read_as_missing("outcome", value, info)
        return value

    @field_validator("reward")
    @classmethod
    def _finite(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and not math.isfinite(value):
            return read_as_missing("reward", value, info)
        return value

    @property
    def verbal_confidences(self) -> list[float | None]:
        return [s.verbal_confidence for s in self.steps]


# --------------------------------------------------------------------------------------- manifest


class DecodingConfig(_Record):
    temperature: float = 0.2
    top_p: float = 1.0
    logprobs: bool = True
    top_logprobs: int = 5
    seed: int = 42
    max_tokens: int | None = 512
    grammar: Annotated[bool, Field(description="Force the four-tag shape with a llama.cpp GBNF grammar.")] = False
    reasoning: Annotated[
        bool, Field(description="Ask the provider to enable reasoning where supported.")
    ] = False


#: Domain options that only say where a cache lives, left out of the config hash: a bm25s index is identified by
#: its corpus sha256 (in the manifest's info), not by its directory, so moving it does not make a different run.
HASH_EXCLUDED_OPTIONS = frozenset({"index_dir"})
#: RunConfig fields added after schema version 1 shipped; left out of the hash while None.
_LATER_FIELDS = ("user_api_base", "consensus_stopping", "api_bases", "user_logprobs")
#: The agent of runs recorded before there was a choice of agents: left out of the hash, so those runs resume.
DEFAULT_AGENT = "react"
#: Where the models are served from: not part of what a run produces, so out of the config hash (a server moved to
#: another port, ``localhost`` for ``127.0.0.1``, a dead replica dropped -- the run still resumes). The latest
#: session's endpoints stay in the config; every session's are in ``Manifest.sessions``.
ENDPOINT_FIELDS = frozenset({"api_base", "api_bases", "user_api_base"})


class ConsensusStopping(_Record):
    """Sequential sampling (``uqh run --stop-on-consensus DELTA``, Mouzouni, "Black-box reliability certification", §9): stop drawing a task's samples once
    its mode is certified at level ``delta`` by ``rule``, from the canonical answers drawn so far (never a label)."""

    rule: Annotated[
        Literal["hoeffding", "anytime"],
        Field(description="hoeffding: the paper's rule (9.1) as printed; anytime: the beta-mixture e-process test "
                          "that the leading class has probability > 1/2 (uqh/harness/sampling/consensus.py)"),
    ] = "anytime"
    delta: Annotated[float, Field(gt=0, lt=1, description="error level of the certificate")]


class RunConfig(_Record):
    """Everything that determines what a run produces. Its hash guards resume."""

    domain: str
    split: str | None = None
    task_ids: list[str]
    samples_per_task: int = 1
    model: str
    api_base: str | None = None
    api_bases: Annotated[
        list[str] | None,
        Field(description="Several endpoints serving the model (uqh run --api-base repeated, or --endpoints FILE), "
                          "calls spread over them; api_base is then the first of them. Left out (and out of the "
                          "hash) for one endpoint, so single-endpoint configs are as before.", exclude_if=_is_none),
    ] = None
    decoding: DecodingConfig = DecodingConfig()
    step_budget: int
    observation_chars: int | None = 420
    domain_options: dict[str, Any] = {}
    user_model: str | None = None
    user_decoding: DecodingConfig | None = None
    user_api_base: Annotated[
        str | None,
        Field(description="OpenAI-compatible endpoint for an API user_model (uqh run --user-api-base); like api_base."),
    ] = None
    prompt_sha256: str
    package_version: str
    continuation: Annotated[
        dict[str, Any] | None,
        Field(description="For continuation runs: source run, branches, extra steps."),
    ] = None
    consensus_stopping: Annotated[
        ConsensusStopping | None,
        Field(description="Sequential sampling: stop a task's samples once its mode is certified (None: draw all)."),
    ] = None
    user_logprobs: Annotated[
        int | None,
        Field(description="Tau2 (uqh run --user-logprobs): the simulated user's model is asked for token logprobs "
                          "with this many top alternatives (the run's --top-logprobs) and its tokens are written to "
                          "user_logprobs.jsonl; null: not asked. Left out (and out of the hash) while null.",
              exclude_if=_is_none, ge=0),
    ] = None

    agent: Annotated[
        str,
        Field(description="The policy that turns the history into the next step (uqh run --agent): react, the paper's "
                          "four-tag text loop, or tools, native function calling. Left out (of the "
                          "manifest and the hash) while react, so react configs are written as before the choice "
                          "existed and older runs resume.", exclude_if=lambda v: v == DEFAULT_AGENT),
    ] = DEFAULT_AGENT

    @property
    def endpoints(self) -> list[str]:
        """The agent model's endpoints: ``api_bases``, else ``[api_base]`` (empty: the provider's own)."""
        return list(self.api_bases) if self.api_bases else ([self.api_base] if self.api_base else [])

    def episode_sort_key(self):
        """Sort key of the run's canonical episode order: task order of ``task_ids``, then sample index."""
        rank = {t: i for i, t in enumerate(self.task_ids)}
        return lambda ep: (rank.get(ep.task_id, len(rank)), ep.task_id, ep.sample_index, ep.episode_id)

    def config_hash(self) -> str:
        """sha256 of the config without :data:`HASH_EXCLUDED_OPTIONS` and :data:`ENDPOINT_FIELDS`."""
        return self._hash(drop=ENDPOINT_FIELDS)

    def legacy_config_hash(self) -> str:
        """The hash run directories written before the endpoints left it carry (endpoints included; fields added
        later left out while None): how such a manifest's own hash is checked."""
        return self._hash(drop=frozenset())

    def _hash(self, drop: frozenset[str]) -> str:
        data = self.model_dump(mode="json")
        for key in _LATER_FIELDS:
            if data.get(key) is None:
                data.pop(key, None)
        if data.get("agent") == DEFAULT_AGENT:
            data.pop("agent")
        for key in drop:
            data.pop(key, None)
        data["domain_options"] = {k: v for k, v in data["domain_options"].items() if k not in HASH_EXCLUDED_OPTIONS}
        return canonical_sha256(data)


def config_hash_of(config: BaseModel, *, excluded: frozenset[str], later: frozenset[str] = frozenset()) -> str:
    """The config hash of a judge's or probe's config: ``excluded`` fields (where it is served) left out, and
    ``later`` fields (added after directories were written) left out while None, so older directories resume."""
    data = {k: v for k, v in config.model_dump(mode="json").items()
            if k not in excluded and not (k in later and v is None)}
    return canonical_sha256(data)


def canonical_sha256(data: Any) -> str:
    """sha256 of ``data`` as canonical JSON (sorted keys, no spaces): the form every config hash is taken of."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def config_differences(old: BaseModel, new: BaseModel, *, ignore: frozenset[str] = frozenset()) -> list[str]:
    """Dotted names of the config fields that differ (nested one level into dicts), ``ignore``'d fields left out."""
    a, b = old.model_dump(mode="json"), new.model_dump(mode="json")
    for key in ignore:
        a.pop(key, None)
        b.pop(key, None)
    diffs = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if va == vb:
            continue
        if isinstance(va, dict) and isinstance(vb, dict):
            diffs.extend(f"{key}.{k}" for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k))
        else:
            diffs.append(key)
    return diffs


class ExecutionSettings(_Record):
    """How the latest session of a run called the model: settings that do not change what a run produces, so
    they are recorded outside the config hash (a resume may change them)."""

    timeout_s: Annotated[float, Field(description="Per-call request timeout in seconds (uqh run --timeout).")]
    max_retries: Annotated[int, Field(description="Retries of a transient failure per call (uqh run --max-retries).")]
    endpoints: Annotated[
        list[str] | None,
        Field(description="The agent model's endpoints in this session (--api-base / --endpoints); null: the "
                          "provider's own, or not recorded (sessions before endpoints were recorded).",
              exclude_if=_is_none),
    ] = None
    user_api_base: Annotated[
        str | None, Field(description="The user model's endpoint in this session (--user-api-base).",
                          exclude_if=_is_none),
    ] = None
    breaker_failures: Annotated[
        int | None, Field(description="Circuit breaker: transient failures in a row, across all endpoints, before the "
                                      "batch may stop (uqh run --breaker-failures).", exclude_if=_is_none),
    ] = None
    breaker_window_s: Annotated[
        float | None, Field(description="Circuit breaker: seconds without a success before the batch may stop "
                                        "(uqh run --breaker-window).", exclude_if=_is_none),
    ] = None
    started_at: Annotated[str | None, Field(description="When the session started (UTC, ISO 8601).",
                                            exclude_if=_is_none)] = None


class Manifest(_Record):
    schema_version: int = SCHEMA_VERSION
    config: RunConfig
    config_hash: str
    created_at: str
    system_prompt: Annotated[str, Field(description="The exact system prompt text used.")]
    info: dict[str, Any] = {}
    execution: Annotated[
        ExecutionSettings | None,
        Field(description="Timeout, retries and endpoints of the latest session (not part of the config hash)."),
    ] = None
    sessions: Annotated[
        list[ExecutionSettings],
        Field(description="Every session that ran episodes, oldest first: where the models were served from and "
                          "how they were called (empty in runs written before sessions were recorded)."),
    ] = []


# --------------------------------------------------------------------------------------- in-flight episodes


class PartialEpisode(BaseModel):
    """An in-flight episode after its last completed step: what a checkpoint holds."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str
    task_id: str
    sample_index: int = 0
    seed: int | None = None
    step_budget: int
    task_prompt: str
    steps: list[Step]
    sidecar: list[LogprobRow]  # rows of this episode's own calls so far (not of a copied prefix)
    user_sidecar: list[LogprobRow] = []  # the simulated user's rows so far (uqh run --user-logprobs)
    prefix_steps: int = 0
    source_episode_id: str | None = None
    branch_index: int | None = None
    started_at: str | None = None


class SkippedPrefix(_Record):
    """One line of a continuation run's ``skipped_prefixes.jsonl``: a censored prefix that was not continued."""

    episode_id: str
    reason: Annotated[str, Field(description="Why the prefix could not be replayed faithfully.")]


class SkippedSample(_Record):
    """One line of ``skipped_samples.jsonl``: a planned sample that sequential sampling did not draw."""

    schema_version: int = SCHEMA_VERSION
    episode_id: Annotated[str, Field(description="The planned episode id '<task_id>#<sample_index>'.")]
    task_id: str
    sample_index: int
    reason: Annotated[str, Field(description="Why it was not drawn (the certificate, in words).")]
    rule: str
    delta: float
    samples_drawn: Annotated[int, Field(description="Samples of the task drawn when its mode was certified.")]
    mode: Annotated[str | None, Field(description="The certified canonical class (null: the no-answer class).")]
    statistic: Annotated[float, Field(description="The rule's statistic at the stop (margin or e-value).")]
    threshold: Annotated[float, Field(description="The value the statistic had to exceed.")]


class StopDecision(_Record):
    """One line of a continuation run's ``stop_decisions.jsonl`` (``--stop-rule ci:H``): where the sequential
    design left a prefix, rewritten after every round (:mod:`uqh.harness.sampling.branch_rules`)."""

    episode_id: Annotated[str, Field(description="The censored source episode (prefix).")]
    stop_rule: Annotated[str, Field(description="The rule that decided, e.g. 'ci:0.2'.")]
    branches: Annotated[int, Field(description="Branches of this prefix run (finished), indices 0..branches-1.", ge=0)]
    resolved: Annotated[int, Field(description="Of them, branches that ended clean (with an outcome).", ge=0)]
    successes: Annotated[int, Field(description="Of the resolved branches, those with Y = 1.", ge=0)]
    interval: Annotated[
        tuple[float, float],
        Field(description="95% beta-binomial confidence sequence for q_Z after these outcomes (valid at any stop)."),
    ]
    stopped_by: Annotated[
        Literal["half_width", "max_branches"] | None,
        Field(description="Why the prefix got no more branches; null while open (a branch of the round failed: "
                          "re-run the command to resume)."),
    ] = None


def export_json_schemas() -> dict[str, Any]:
    return {m.__name__: m.model_json_schema() for m in (Manifest, Episode, LogprobRow)}
