"""The probe directory: per-step probe values over recorded traces (``uqh probe``), its schema and its one reader.

A probe directory is a sidecar of one or more run directories, written into its own ``--out`` (never into a
probed run), by the runner ``uqh judge`` uses:

- ``probe_manifest.json`` -- :class:`ProbeManifest`: the probed runs (path + config hash), the probe, its model,
  decoding and the sha256 of its prompt template; its hash guards resume;
- ``probes.jsonl``        -- one :class:`ProbeValue` per line: one probe at one step of one episode.

A value the provider could not give (no logprobs, neither answer option among the top alternatives; for
observation_surprise also an echo or a chat replay whose tokens do not spell the observation exactly) is recorded
with ``value`` null and its ``missing_reason`` -- never guessed. A failed call (after the model client's retries)
is not a value: nothing is written and re-running the command picks it up again.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from uqh.rundir.judgments import JudgedRun
from uqh.rundir.schema import SCHEMA_VERSION, CallRecord, DecodingConfig, config_differences, config_hash_of
from uqh.rundir.sidecar_dir import SidecarDir

PROBE_MANIFEST_FILE = "probe_manifest.json"
PROBES_FILE = "probes.jsonl"


class ProbeKind(str, Enum):
    """The probes ``uqh probe`` can run (the predictor of the same name reads its values)."""

    p_true = "p_true"
    observation_surprise = "observation_surprise"


#: observation_surprise's teacher-forcing methods (``uqh probe --surprise-method``); ``auto`` tries them in order.
SurpriseMethod = Literal["auto", "echo", "forced", "replay"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProbeConfig(_Record):
    """What determines the values a probe directory holds. Its hash guards resume (``api_base`` excluded)."""

    runs: list[JudgedRun]
    probe: ProbeKind
    model: Annotated[str, Field(description="Model string of the probing model as given (e.g. local:smollm2).")]
    api_base: Annotated[str | None, Field(description="Endpoint of the first probing run (not hashed).")] = None
    decoding: DecodingConfig
    prompt_sha256: Annotated[str, Field(description="sha256 of the probe's prompt template file.")]
    package_version: str
    surprise_method: Annotated[
        SurpriseMethod | None,
        Field(description="observation_surprise: how observations are teacher-forced -- 'auto' (completion echo, "
                          "else grammar forcing on a local: model, else the chat replay), or only 'echo', "
                          "'forced' or 'replay'; null for p_true (and probe directories made before it existed)."),
    ] = None

    def config_hash(self) -> str:
        return config_hash_of(self, excluded=PROBE_HASH_EXCLUDED, later=PROBE_LATER_FIELDS)


PROBE_HASH_EXCLUDED = frozenset({"api_base"})
#: ProbeConfig fields added after probe directories shipped; left out of the hash while None.
PROBE_LATER_FIELDS = frozenset({"surprise_method"})


def probe_config_differences(old: ProbeConfig, new: ProbeConfig) -> list[str]:
    return config_differences(old, new, ignore=PROBE_HASH_EXCLUDED)


class ProbeManifest(_Record):
    schema_version: int = SCHEMA_VERSION
    config: ProbeConfig
    config_hash: str
    created_at: str
    info: dict[str, Any] = {}


class ProbeValue(_Record):
    """One probe at step ``t`` of one episode of one probed run."""

    schema_version: int = SCHEMA_VERSION
    run: Annotated[int, Field(description="Index of the probed run in the probe manifest's runs list.", ge=0)]
    episode_id: str
    t: Annotated[int, Field(description="1-based step index of the probed step.", ge=1)]
    probe: ProbeKind
    value: Annotated[float | None, Field(description="The probe's value: P(True) in [0, 1], or observation_surprise's "
                                                     "mean NLL per token (nats); null when missing.")]
    missing_reason: Annotated[str | None, Field(description="Why value is null; null when present.")] = None
    option_logprobs: Annotated[
        dict[str, float | None],
        Field(description="Answer option -> summed probability's log over its spellings among the top "
                          "alternatives of the answer token (null: not among them)."),
    ] = {}
    raw_text: str = ""
    call: CallRecord
    probed_at: str | None = None
    # observation_surprise only (null for p_true): how the observation's tokens were scored and what they gave
    scorer_mode: Annotated[
        str | None, Field(description="observation_surprise: 'agent' (the probed run's model and system prompt) or "
                                      "'auxiliary' (another model, with the observer prompt).")] = None
    method: Annotated[
        str | None, Field(description="observation_surprise: 'completion_echo' (teacher-forced through "
                                      "/v1/completions echo), 'grammar_forced' (a greedy chat reply forced by a "
                                      "GBNF grammar to be the observation) or 'chat_replay' (a greedy chat reply, "
                                      "kept only when it reproduces the observation exactly).")] = None
    n_tokens: Annotated[int | None, Field(description="observation_surprise: the observation's scored tokens.")] = None
    min_prob: Annotated[
        float | None, Field(description="observation_surprise: the smallest probability of an observation token.")
    ] = None
    echo_refused: Annotated[
        str | None, Field(description="observation_surprise: why /v1/completions echo was not used (then "
                                      "method is grammar_forced or chat_replay).")] = None

    @model_validator(mode="after")
    def _value_xor_missing(self) -> "ProbeValue":
        if (self.value is None) == (self.missing_reason is None):
            raise ValueError("a probe value has either a value or a missing_reason, not both or neither")
        return self

    @property
    def key(self) -> tuple[int, str, int, str]:
        return (self.run, self.episode_id, self.t, self.probe.value)


@dataclass
class ProbeDir(SidecarDir[ProbeValue]):
    """A probe directory opened for reading. Build it with :meth:`open`; it never writes."""

    MANIFEST_FILE: ClassVar[str] = PROBE_MANIFEST_FILE
    MANIFEST: ClassVar[type] = ProbeManifest
    RECORDS_FILE: ClassVar[str] = PROBES_FILE
    RECORD: ClassVar[type] = ProbeValue
    KIND: ClassVar[str] = "probe"
    MADE_BY: ClassVar[str] = "uqh probe RUN... --probe p_true|observation_surprise --model M"

    def values(self) -> list[ProbeValue]:
        """Probe values in file order, torn-line safe, the first line of each key kept (cached)."""
        return self.records()

    def values_for_run(self, config_hash: str) -> dict[tuple[str, int], ProbeValue]:
        """``(episode_id, t) -> value`` of the probed run with this config hash (empty if it was not probed)."""
        runs = [k for k, r in enumerate(self.config.runs) if r.config_hash == config_hash]
        return {(v.episode_id, v.t): v for v in self.values() if v.run in runs}
