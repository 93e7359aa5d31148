"""The judge directory: GPA judgments of recorded traces (``uqh judge``), its schema and its one reader.

A judge directory is a sidecar of one or more run directories, written into its own ``--out`` (never into a
judged run):

- ``judge_manifest.json`` -- :class:`JudgeManifest`: the judged runs (path + config hash), the judge model, its
  decoding and the sha256 of every judge prompt; its hash guards resume like a run's;
- ``judgments.jsonl``     -- one :class:`Judgment` per line: one judge (metric) on one episode, one repeat.

A judgment whose reply could not be parsed even after one repair is recorded with ``score`` null and its
``missing_reason`` -- never guessed. A judge call that failed (after the model client's retries) is not a
judgment: nothing is written and re-running the command picks it up again.

:class:`JudgeDir` reads the directory torn-line safe and de-duplicates judgments by
``(run, episode_id, metric, repeat)`` (first kept), as :class:`rundir.RunDir` does for episodes.
Human labels for ``uqh judge --report --labels FILE`` are read by :func:`read_labels_file`.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from uqh.rundir.errors import UserError, first_line
from uqh.rundir.schema import SCHEMA_VERSION, CallRecord, DecodingConfig, config_differences, config_hash_of
from uqh.rundir.sidecar_dir import SidecarDir

JUDGE_MANIFEST_FILE = "judge_manifest.json"
JUDGMENTS_FILE = "judgments.jsonl"
#: Scores are integers on the paper's 4-point scale (Agent GPA §4.1.2: "a 4-point scale from 0 to 3").
MIN_SCORE, MAX_SCORE = 0, 3


class JudgeMetric(str, Enum):
    """The Agent GPA judges ("What is your agent's GPA?", §3). The only place the set of judges is defined."""

    GF = "GF"
    LC = "LC"
    EE = "EE"
    PQ = "PQ"
    PA = "PA"
    TS = "TS"
    TC = "TC"

    @property
    def label(self) -> str:
        return METRIC_LABELS[self]


METRIC_LABELS = {
    JudgeMetric.GF: "Goal Fulfillment",
    JudgeMetric.LC: "Logical Consistency",
    JudgeMetric.EE: "Execution Efficiency",
    JudgeMetric.PQ: "Plan Quality",
    JudgeMetric.PA: "Plan Adherence",
    JudgeMetric.TS: "Tool Selection",
    JudgeMetric.TC: "Tool Calling",
}


def parse_metrics(text: str) -> list[JudgeMetric]:
    """``"GF,LC"`` -> [GF, LC] (order kept, duplicates refused); UserError naming the unknown codes."""
    codes = [c.strip().upper() for c in text.split(",") if c.strip()]
    known = {m.value for m in JudgeMetric}
    unknown = [c for c in codes if c not in known]
    if unknown or not codes:
        raise UserError(f"unknown judge metric(s) {', '.join(unknown) or repr(text)}; use a comma-separated subset "
                        f"of {','.join(known)}")
    if len(set(codes)) != len(codes):
        raise UserError(f"--metrics lists a metric twice: {text}")
    return [JudgeMetric(c) for c in codes]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------------- manifest


class JudgedRun(_Record):
    path: Annotated[str, Field(description="Absolute path of the judged run directory (read only).")]
    config_hash: Annotated[str, Field(description="The judged run's config hash when it was first judged.")]
    domain: str
    model: Annotated[str, Field(description="The agent model of the judged run.")]


class JudgeConfig(_Record):
    """What determines the judgments a judge directory holds. Its hash guards resume.

    Which metrics, how many repeats and how many episodes are judged are the plan of one invocation, not part
    of the config: re-running with more metrics or repeats adds judgments to the same directory.
    """

    runs: list[JudgedRun]
    judge_model: Annotated[str, Field(description="litellm model string of the judge (openai/NAME with api_base).")]
    api_base: Annotated[str | None, Field(description="Endpoint of the first judging run (not hashed).")] = None
    decoding: DecodingConfig
    prompts_sha256: Annotated[
        dict[str, str], Field(description="Metric code -> sha256 of that judge's system prompt template.")
    ]
    trace_format: Annotated[int, Field(description="Version of the trace rendering shown to the judges.")]
    package_version: str

    def config_hash(self) -> str:
        """sha256 of the config without :data:`JUDGE_HASH_EXCLUDED` (where the judge is served is not what it is:
        a restarted server on another port resumes the same judgments)."""
        return config_hash_of(self, excluded=JUDGE_HASH_EXCLUDED)


JUDGE_HASH_EXCLUDED = frozenset({"api_base"})


def judge_config_differences(old: JudgeConfig, new: JudgeConfig) -> list[str]:
    """Dotted names of the hashed fields that differ (one level into dicts)."""
    return config_differences(old, new, ignore=JUDGE_HASH_EXCLUDED)


class JudgeManifest(_Record):
    schema_version: int = SCHEMA_VERSION
    config: JudgeConfig
    config_hash: str
    created_at: str
    info: dict[str, Any] = {}


# --------------------------------------------------------------------------------------- judgments


class JudgeAttempt(_Record):
    """One judge call: the reply as received and, if it was rejected, why."""

    attempt: Annotated[int, Field(description="0 for the first call, 1 for the repair request.")]
    raw_text: str
    error: Annotated[
        str | None, Field(description="Why the reply was rejected (sent back in the repair), or null.")
    ] = None
    call: CallRecord


class Judgment(_Record):
    """One judge (metric) on one episode of one judged run, one repeat."""

    schema_version: int = SCHEMA_VERSION
    run: Annotated[int, Field(description="Index of the judged run in the judge manifest's runs list.", ge=0)]
    episode_id: str
    metric: JudgeMetric
    repeat: Annotated[int, Field(description="0-based repeat index (independent judge calls, own seeds).", ge=0)]
    score: Annotated[
        int | None, Field(description="0 (worst) .. 3 (best); null when the reply never parsed.", ge=MIN_SCORE,
                          le=MAX_SCORE)
    ]
    rationale: str | None = None
    cited_steps: Annotated[list[int], Field(description="1-based step indices the judge cited, sorted, unique.")] = []
    missing_reason: Annotated[
        str | None, Field(description="Why score is null (the last parse error); null when scored.")
    ] = None
    n_steps: Annotated[int, Field(description="Steps of the judged trace (cited steps are within 1..n_steps).")]
    seed: int | None = None
    attempts: Annotated[list[JudgeAttempt], Field(description="Every judge call made, in order (1 or 2).")]
    judged_at: str | None = None

    @model_validator(mode="after")
    def _score_xor_missing(self) -> "Judgment":
        if (self.score is None) == (self.missing_reason is None):
            raise ValueError("a judgment has either a score or a missing_reason, not both or neither")
        if any(not 1 <= t <= self.n_steps for t in self.cited_steps):
            raise ValueError(f"cited steps {self.cited_steps} outside 1..{self.n_steps}")
        return self

    @property
    def key(self) -> tuple[int, str, str, int]:
        return (self.run, self.episode_id, self.metric.value, self.repeat)


# --------------------------------------------------------------------------------------- reader


@dataclass
class JudgeDir(SidecarDir[Judgment]):
    """A judge directory opened for reading. Build it with :meth:`open`; it never writes."""

    MANIFEST_FILE: ClassVar[str] = JUDGE_MANIFEST_FILE
    MANIFEST: ClassVar[type] = JudgeManifest
    RECORDS_FILE: ClassVar[str] = JUDGMENTS_FILE
    RECORD: ClassVar[type] = Judgment
    KIND: ClassVar[str] = "judge"
    MADE_BY: ClassVar[str] = "uqh judge RUN... --judge-model M"

    def judgments(self) -> list[Judgment]:
        """Judgments in file order, torn-line safe, the first line of each key kept (cached)."""
        return self.records()


# --------------------------------------------------------------------------------------- human labels


def validation_message(exc: Exception) -> str:
    """The first problem of a pydantic ValidationError as ``field: message`` (else the first line)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
        except (IndexError, TypeError, ValueError):
            return first_line(exc)
        loc = ".".join(str(p) for p in first.get("loc", ())) or "record"
        return f"{loc}: {first.get('msg', '')}"[:200]
    return first_line(exc)


class HumanLabel(_Record):
    """One human score of one episode on one metric (``--labels FILE``)."""

    episode_id: str
    metric: JudgeMetric
    score: Annotated[int, Field(ge=MIN_SCORE, le=MAX_SCORE, strict=True)]
    run: Annotated[
        str | None,
        Field(description="Which judged run: its index, directory path or directory name; needed only when an "
                          "episode id occurs in several judged runs."),
    ] = None


_LABEL_HINT = ("expected columns episode_id, metric, score (0-3) and optionally run -- CSV with a header row, or "
               "JSONL objects with those keys")


def read_labels_file(path: str | Path) -> list[HumanLabel]:
    """Human labels from a CSV (header row) or JSONL file; UserError with the line number for a bad record, or
    for two labels of the same (run, episode, metric)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"labels file {path} does not exist; {_LABEL_HINT}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read labels file {path}: {first_line(exc)}") from None
    records: list[tuple[int, dict]] = []
    if path.suffix.lower() in (".jsonl", ".json"):
        for lineno, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError as exc:
                raise UserError(f"{path}:{lineno}: not JSON ({first_line(exc)}); {_LABEL_HINT}") from None
            records.append((lineno, obj))
    else:
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames or not {"episode_id", "metric", "score"} <= {f.strip() for f in reader.fieldnames}:
            raise UserError(f"{path}: header {reader.fieldnames}; {_LABEL_HINT}")
        for row in reader:
            obj = {k.strip(): (v.strip() if isinstance(v, str) else v) for k, v in row.items() if k is not None}
            if obj.get("run") in ("", None):
                obj.pop("run", None)
            score = obj.get("score")
            if isinstance(score, str) and score.lstrip("-").isdigit():
                obj["score"] = int(score)
            records.append((reader.line_num, obj))
    out: list[HumanLabel] = []
    seen: set[tuple] = set()
    for lineno, obj in records:
        if isinstance(obj, dict) and isinstance(obj.get("metric"), str):
            obj = dict(obj, metric=obj["metric"].strip().upper())
        if isinstance(obj, dict) and isinstance(obj.get("run"), int):
            obj = dict(obj, run=str(obj["run"]))
        try:
            label = HumanLabel.model_validate(obj)
        except ValueError as exc:
            raise UserError(f"{path}:{lineno}: not a label ({validation_message(exc)}); {_LABEL_HINT}") from None
        key = (label.run, label.episode_id, label.metric)
        if key in seen:
            raise UserError(f"{path}:{lineno}: a second label for {label.episode_id} {label.metric.value}")
        seen.add(key)
        out.append(label)
    if not out:
        raise UserError(f"labels file {path} holds no labels; {_LABEL_HINT}")
    return out
