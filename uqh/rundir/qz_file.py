"""The q_Z file: per censored prefix, the estimated continuation-success weight q_hat_Z (Appendix H.1).

One JSON object per line::

    {"episode_id": "<task_id>#<k>", "q_hat_z": 0.4, "n_valid": 10, "method": "mc"}

A sequential continuation run (``uqh continue --stop-rule ci:H``) adds, per continued prefix, ``branches`` (run),
``stop_rule`` and, for Monte Carlo records, ``interval`` (the 95% confidence sequence the rule stopped on)::

    {"episode_id": "t#0", "q_hat_z": 0.0, "n_valid": 7, "method": "mc", "branches": 7, "stop_rule": "ci:0.2",
     "interval": [0.0, 0.31]}

They are optional and left out when absent, so a fixed-design file is unchanged and older files still read.

``uqh continue`` writes it with :func:`write_qz_file`; ``uqh score
--censoring exact --q-z FILE`` reads it with :func:`read_qz_file`. ``q_hat_z`` is the plug-in weight of the
exact reduced censored score, Eq. (4) / Eq. (16) of the paper.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from uqh.rundir.atomic import atomic_write_text
from uqh.rundir.errors import RunDirWriteError, UserError, read_user_text
from uqh.rundir.schema import AUDIT_JSON, AUDIT_MD, QZ_FILE


def _is_none(value) -> bool:
    return value is None


class QzRecord(BaseModel):
    """One line of a q_Z file."""

    model_config = ConfigDict(extra="forbid")

    episode_id: Annotated[str, Field(description="The censored (max_steps) source episode this estimate is for.")]
    q_hat_z: Annotated[float, Field(description="Estimated P(Y=1 | H_Z) for the stopped prefix, in [0, 1].")]
    n_valid: Annotated[int, Field(description="Continuation branches (or labels) the estimate rests on.", ge=0)]
    method: Annotated[Literal["mc", "plugin", "hybrid"], Field(description="Estimator route of Appendix H.1.")]
    branches: Annotated[
        int | None,
        Field(description="Sequential stop rules: continuation branches run for this prefix.", ge=0,
              exclude_if=_is_none),
    ] = None
    stop_rule: Annotated[
        str | None, Field(description="Sequential stop rules: the rule, e.g. 'ci:0.2'.", exclude_if=_is_none)
    ] = None
    interval: Annotated[
        tuple[float, float] | None,
        Field(description="Sequential stop rules, mc records: the 95% confidence sequence for q_Z at the stop "
                          "(valid under optional stopping; uqh.harness.sampling.branch_rules).", exclude_if=_is_none),
    ] = None

    @field_validator("q_hat_z")
    @classmethod
    def _in_unit_interval(cls, v: float) -> float:
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise ValueError(f"q_hat_z must be a finite number in [0, 1], got {v}")
        return v


def write_qz_file(path: Path, records: Iterable[QzRecord]) -> None:
    """Write records as JSONL (atomic: temp file + os.replace)."""
    atomic_write_text(Path(path), "".join(r.model_dump_json() + "\n" for r in records))


def write_continuation_audit(cont_dir: Path, records: Iterable[QzRecord], audit_json: str, audit_md: str) -> None:
    """The q_Z estimates of a continuation run (``qz.jsonl``) and its audit (``audit.json``, ``audit.md``), each
    replaced atomically; a failure raises :class:`RunDirWriteError`."""
    cont_dir = Path(cont_dir)
    try:
        write_qz_file(cont_dir / QZ_FILE, records)
        atomic_write_text(cont_dir / AUDIT_JSON, audit_json + "\n")
        atomic_write_text(cont_dir / AUDIT_MD, audit_md + "\n")
    except OSError as exc:
        raise RunDirWriteError(cont_dir, exc) from None


def read_qz_file(path: Path) -> dict[str, QzRecord]:
    """Read a q_Z file into ``{episode_id: QzRecord}``. Bad files raise :class:`UserError` (one line)."""
    path = Path(path)
    if path.is_dir():
        inside = f"; did you mean {path / QZ_FILE}?" if (path / QZ_FILE).is_file() else ""
        raise UserError(f"q_Z file {path} is a directory, not a file; pass the {QZ_FILE} written by `uqh continue` "
                        f"to --q-z{inside}")
    if not path.is_file():
        raise UserError(f"q_Z file {path} does not exist; pass the file written by `uqh continue` to --q-z")
    out: dict[str, QzRecord] = {}
    for lineno, raw in enumerate(read_user_text(path, f"q_Z file {path}").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            rec = QzRecord.model_validate(json.loads(raw))
        except (json.JSONDecodeError, ValidationError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"{path}:{lineno}: not a q_Z record ({first}); expected "
                            '{"episode_id", "q_hat_z", "n_valid", "method"}') from None
        if rec.episode_id in out:
            raise UserError(f"{path}:{lineno}: duplicate q_Z record for episode {rec.episode_id!r}")
        out[rec.episode_id] = rec
    return out


def qz_source(path: Path) -> tuple[str, str] | None:
    """(config hash, directory) of the run a q_Z file estimates, from the continuation manifest beside it; None for
    a file outside a continuation run directory (made by hand or copied out), whose source cannot be known."""
    from uqh.rundir.reader import read_manifest_file
    from uqh.rundir.schema import MANIFEST_FILE

    path = Path(path)
    if not (path.parent / MANIFEST_FILE).is_file():
        return None
    continuation = read_manifest_file(path.parent).config.continuation or {}
    if "source_config_hash" not in continuation:
        return None
    return continuation["source_config_hash"], str(continuation.get("source_run_dir", "?"))


def qz_for_runs(paths: Iterable[Path], runs: list[tuple[Path, str]]) -> list[dict[str, float]]:
    """q_hat_Z by episode id for each of ``runs`` ((directory, config hash) pairs), from the q_Z files ``paths``.

    Episode ids repeat across runs (``arith-0000#0`` in every arithmetic run), so a file applies only to the run
    it was estimated from; a file from none of them is refused in one line. A file without a source (see
    :func:`qz_source`) applies to every run."""
    per_run: list[dict[str, float]] = [{} for _ in runs]
    for path in paths:
        records = read_qz_file(path)
        source = qz_source(path)
        targets = [i for i, (_, config_hash) in enumerate(runs) if source is None or config_hash == source[0]]
        if not targets:
            given = ", ".join(str(d) for d, _ in runs)
            raise UserError(f"q_Z file {path} estimates run {source[1]} (config hash {source[0][:12]}), not "
                            f"{given}; pass the qz.jsonl that `uqh continue` wrote for that run")
        for i in targets:
            per_run[i].update({k: r.q_hat_z for k, r in records.items()})
    return per_run
