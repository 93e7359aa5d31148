"""What `uqh view` knows of each run while it serves: read through :class:`uqh.rundir.reader.RunDir` only, cached,
and brought up to date by reading what was appended since the last request.

- the run list row (:meth:`ViewedRun.overview`) comes from the manifest and the episodes file's line index (stop
  reason, outcome and cost of each finished episode, read from its line without parsing the record);
- the trajectory list (:meth:`ViewedRun.trajectories`) parses finished episodes in chunks, in file order, and keeps
  one small summary per episode (its task text clipped, its last value of every per-step predictor);
- one trajectory (:meth:`ViewedRun.trajectory`) reads one episode and its sidecar rows at their indexed offsets
  (one seek each), or an episode in progress from its checkpoint.

A run that cannot be read (a bad manifest, a line that is not a record) is kept in the list with its one-line
error: one bad run never hides the good ones; a line of a run that is not a record is skipped by the trajectory list
and named on the run's page. Each run has one reader (:class:`RunDir`): its line indexes are built once, and each
has its own lock, so the run list, the trajectory list and a trajectory page share them. Episodes in progress are
read from their checkpoints (:meth:`uqh.rundir.reader.RunDir.live_checkpoints`) and shown as ``running``.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uqh.rundir.errors import UserError
from uqh.rundir.judgments import JudgeDir
from uqh.rundir.line_index import LineIndex
from uqh.rundir.probes import ProbeDir
from uqh.rundir.qz_file import qz_for_runs
from uqh.rundir.reader import RunDir, manifest_stamp, read_manifest_file
from uqh.rundir.schema import QZ_FILE, Episode, LogprobRow, PartialEpisode, Step, StopReason
from uqh.scoring.registry import BASE_RATE, PREDICTORS, predictor_label
from uqh.scoring.streams import episode_step_values
from uqh.reports.report.traces import BASE_RATE_STYLE, PLATT_DASH, style_of

#: Episodes parsed into summaries per trajectory-list request (the page asks again for the rest).
SUMMARY_CHUNK = 200
#: Characters of the task text kept in a summary (filtering by task text searches these).
TASK_TEXT_CHARS = 300
PRIMARY = "verbal"


def clean(v: float | None) -> float | None:
    return float(v) if (v is not None and math.isfinite(v)) else None


def probe_predictor_names() -> list[str]:
    """The predictors whose streams come from probe directories (``uqh probe``), e.g. p_true."""
    return [p.name for p in PREDICTORS.values() if p.probe is not None]


def step_predictor_names() -> list[str]:
    """The per-step predictors scored by default (trajectory predictors need the whole run: `uqh report` draws
    them; the opt-in token signals stay out of the chart, as in the report)."""
    return [p.name for p in PREDICTORS.values() if p.step_value is not None and p.default]


@dataclass
class ViewedRun:
    """One run directory as the viewer sees it; ``key`` is its place in the URL."""

    key: str
    path: Path
    #: The one reader of the run: its line indexes are built once and shared by every page (each index has its own
    #: lock, so the run list, the trajectory list and a trajectory page read in parallel once it is built).
    reader: RunDir | None = None
    error: str | None = None
    summaries: list[dict[str, Any]] = field(default_factory=list)
    #: How many episode ids (in the index's order) the trajectory list has read: summaries, and the lines that
    #: could not be parsed (named in ``bad_records``).
    read: int = 0
    bad_records: list[str] = field(default_factory=list)
    verbal: dict[str, list[float]] = field(default_factory=dict)  # episode id -> verbal stream (the Platt fit)
    platt: dict[str, list[float | None]] = field(default_factory=dict)
    platt_for: int = -1  # how many summaries the Platt fit was made on
    qz: dict[str, float] = field(default_factory=dict)  # censored episode id -> q_hat_Z (from a continuation run)
    judged: dict[str, dict[str, float]] = field(default_factory=dict)  # episode id -> judge metric -> mean score
    #: episode id -> probe predictor (e.g. p_true) -> its value per step (None: missing), from probe directories
    probed: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    list_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    page_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    checkpoint_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: The manifest's (inode, mtime, size) when last found to be this run's (:meth:`is_same_run`).
    manifest_stamp: tuple[int, int, int] | None = None

    @classmethod
    def open(cls, key: str, path: Path) -> "ViewedRun":
        run = cls(key=key, path=path, manifest_stamp=manifest_stamp(path))
        try:
            run.reader = RunDir.open(path)
        except UserError as exc:
            run.error = str(exc)
        return run

    def is_same_run(self) -> bool:
        """Whether the directory still holds the run opened (False: it was deleted and a run started afresh at the
        same path). A manifest not rewritten since (same stamp) is; a rewritten one (a resume records its session)
        is when its creation time and config hash are unchanged."""
        stamp = manifest_stamp(self.path)
        if stamp == self.manifest_stamp:
            return True
        if stamp is None:
            return False
        try:
            manifest = read_manifest_file(self.path)
        except UserError:
            return self.reader is None
        if self.reader is None:
            return False
        old = self.reader.manifest
        if (manifest.created_at, manifest.config_hash) != (old.created_at, old.config_hash):
            return False
        self.manifest_stamp = stamp
        return True

    # ------------------------------------------------------------------ the run list

    def overview(self) -> dict[str, Any]:
        """The run list row: domain, model, done/planned, stop-reason counts, base rate, cost, state, episodes in
        progress (call with ``list_lock`` held)."""
        if self.reader is None:
            return {"key": self.key, "path": str(self.path), "error": self.error}
        try:
            index = self.reader.episode_index()
            with index.lock:
                heads = [index.heads[e] for e in index.order]
            planned = self.reader.planned
            in_flight = len(self.in_progress(index)[0])
        except (UserError, OSError) as exc:
            return {"key": self.key, "path": str(self.path), "error": str(exc)}
        stops: dict[str, int] = {}
        for h in heads:
            stops[h.stop_reason] = stops.get(h.stop_reason, 0) + 1
        labels = [h.outcome for h in heads if h.stop_reason == "clean" and h.outcome is not None]
        costs = [h.cost_usd for h in heads if h.cost_usd is not None]
        config = self.reader.config
        running = self.reader.is_being_written()
        return {
            "key": self.key, "path": str(self.path), "error": None, "domain": config.domain, "model": config.model,
            "kind": "continuation" if self.reader.is_continuation else "run",
            "done": len(heads), "planned": planned, "stops": stops, "in_progress": in_flight,
            "base_rate": base_rate(labels), "cost_usd": sum(costs) if costs else None,
            "state": "running" if running else ("finished" if len(heads) >= planned else "stopped"),
            "notes": self.index_notes(index),
        }

    @staticmethod
    def index_notes(index: LineIndex) -> list[str]:
        """What the episodes file's index met: a truncation, lines without an episode id (by line number)."""
        return index.notes + [f"{index.path.name} line {n}: {why}" for n, why in index.bad_lines]

    # ------------------------------------------------------------------ episodes in progress

    def in_progress(self, index: LineIndex | None = None) -> tuple[dict[str, PartialEpisode], list[str]]:
        """The episodes in flight (their checkpoints, read through the reader, a file parsed again only when it
        changed) that have no episode line yet, and the notes about unreadable checkpoints."""
        index = index or self.reader.episode_index()
        with self.checkpoint_lock:
            partials, notes = self.reader.live_checkpoints()
        with index.lock:
            return {eid: p for eid, p in partials.items() if eid not in index.blocks}, notes

    def running_summaries(self) -> tuple[list[dict[str, Any]], list[str]]:
        """One summary per episode in progress (stop ``running``, or ``interrupted`` when no writer holds the run),
        with its steps so far, and the checkpoint notes."""
        partials, notes = self.in_progress()
        state = "running" if self.reader.is_being_written() else "interrupted"
        out = []
        for eid in sorted(partials):
            p = partials[eid]
            values = episode_step_values(p, p.sidecar) if p.steps else {}
            out.append({"id": eid, "task": p.task_id, "text": p.task_prompt[:TASK_TEXT_CHARS], "stop": state,
                        "y": None, "steps": len(p.steps), "budget": p.step_budget,
                        "last": {k: clean(v[-1]) if v else None for k, v in values.items()},
                        "judged": None, "q_hat_z": None})
        return out, notes

    # ------------------------------------------------------------------ the trajectory list

    def trajectories(self, since: int) -> dict[str, Any]:
        """Summaries of the finished episodes from position ``since`` on (file order), at most
        :data:`SUMMARY_CHUNK` newly parsed; ``done`` is how many episodes have finished by now, ``read`` how many of
        them were read (a line that is not a record is skipped, and named in ``notes``); ``running`` the episodes
        in progress. Call with ``lock`` held."""
        if self.reader is None:
            raise UserError(self.error or "unreadable run")
        index = self.reader.episode_index()
        with index.lock:
            ids = list(index.order[self.read:self.read + SUMMARY_CHUNK]) if len(self.summaries) < since + SUMMARY_CHUNK else []
            done = len(index.order)
        for eid in ids:
            try:
                ep = self.reader.episode(eid, refresh=False)
            except UserError as exc:
                self.bad_records.append(str(exc))
                self.read += 1
                continue
            if ep is None:  # the file was rewritten under the index (re-indexed): the next request continues
                break
            self.summaries.append(self._summary(ep))
            self.read += 1
        running, notes = self.running_summaries()
        return {"since": since, "items": self.summaries[since:], "read": self.read, "done": done,
                "running": running, "notes": self.index_notes(index) + self.bad_records + notes,
                "predictors": self.predictor_styles(with_derived=False)}

    def _summary(self, ep: Episode) -> dict[str, Any]:
        row = self.reader.last_accepted_row(ep.episode_id, ep.steps[-1].t) if ep.steps else None
        values = episode_step_values(ep, [row] if row is not None else []) if ep.steps else {}
        self.verbal[ep.episode_id] = [PREDICTORS[PRIMARY].step_value(s, None) for s in ep.steps]
        return {"id": ep.episode_id, "task": ep.task_id, "text": ep.task_prompt[:TASK_TEXT_CHARS],
                "stop": ep.stop_reason.value, "y": ep.outcome, "steps": len(ep.steps), "budget": ep.step_budget,
                "last": {p: clean(v[-1]) if v else None for p, v in values.items()},
                "judged": self.judged.get(ep.episode_id), "q_hat_z": self.qz.get(ep.episode_id)}

    # ------------------------------------------------------------------ one trajectory

    def trajectory(self, episode_id: str) -> dict[str, Any] | None:
        """One episode, finished or in progress, with every per-step predictor, the Platt stream (when fitted), the
        base rate, its transcript, judge scores and q_hat_Z, and the tokens of each step's accepted completion;
        None when it has neither an episode line nor a checkpoint (call with ``page_lock`` held)."""
        if self.reader is None:
            raise UserError(self.error or "unreadable run")
        ep = self.reader.episode(episode_id)
        if ep is None:
            return self.trajectory_in_progress(episode_id)
        rows = self.reader.episode_sidecar_rows(episode_id)
        values = {p: [clean(v) for v in vals] for p, vals in episode_step_values(ep, rows).items()}
        notes = list(self.reader.sidecar_index().notes)
        for name, per_t in self.probed.get(episode_id, {}).items():  # probe values, drawn like any stream
            values[name] = [clean(v) if v is not None else None for v in per_t]
        if episode_id in self.platt and self.platt_for >= 0:
            values[f"{PRIMARY}_platt"] = self.platt[episode_id]
        with self.list_lock:
            listed = self.overview()
        accepted = {r.t: r for r in rows if r.accepted}
        missing_rows = [s.t for s in ep.steps if s.t not in accepted]
        if missing_rows:
            notes.append(f"no accepted sidecar row for step(s) {', '.join(map(str, missing_rows))}: their token "
                         "predictors are missing (a sidecar cut short, or a provider without logprobs)")
        user_rows = self.reader.episode_user_sidecar_rows(episode_id)
        return {**self.trajectory_json(ep, episode_json(ep, values), rows, user_rows, listed.get("base_rate")),
                "judged": self.judged.get(episode_id), "q_hat_z": self.qz.get(episode_id), "notes": notes,
                "running": False, "platt_pending": self.platt_for != listed.get("done")}

    def trajectory_in_progress(self, episode_id: str) -> dict[str, Any] | None:
        """An episode in progress from its checkpoint: its steps so far and their tokens, stop ``running`` (or
        ``interrupted``); None when there is no such checkpoint."""
        partials, notes = self.in_progress()
        p = partials.get(episode_id)
        if p is None:
            return None
        values = {k: [clean(v) for v in vals] for k, vals in episode_step_values(p, p.sidecar).items()}
        state = "running" if self.reader.is_being_written() else "interrupted"
        with self.list_lock:
            ybar = self.overview().get("base_rate")
        ep = {"id": p.episode_id, "task": p.task_id, "text": p.task_prompt, "stop": state, "y": None, "reward": None,
              "steps": steps_json(p.steps), "values": values, "failed": [], "censored": False}
        if state == "interrupted":
            notes.append("no writer holds this run: the episode stopped at its last checkpoint (`uqh run` with the "
                         "same --out resumes it)")
        return {**self.trajectory_json(p, ep, p.sidecar, p.user_sidecar, ybar), "judged": None, "q_hat_z": None,
                "notes": notes, "running": True, "platt_pending": False}

    def trajectory_json(self, ep: Episode | PartialEpisode, shown: dict[str, Any], rows: list[LogprobRow],
                        user_rows: list[LogprobRow], ybar: float | None) -> dict[str, Any]:
        """The chart's series (with the base rate ȳ), the episode as drawn, and its tokens: the agent's accepted
        completions and the simulated user's turns (Tau2 with --user-logprobs) after the agent's step of the same
        t (the opening is t = 0; the reply to step t's message is the observation of step t)."""
        if ybar is not None:
            shown["values"][BASE_RATE] = [ybar] * len(ep.steps)
        predictors = [p for p in self.predictor_styles() if p["key"] in shown["values"]]
        if ybar is not None:
            predictors[-1] = {**predictors[-1], "label": f"Base rate ȳ = {ybar:.3f}"}
        accepted = {r.t: r for r in rows if r.accepted}
        tokens = [tokens_json(accepted[t]) for t in sorted(accepted)]
        tokens += [tokens_json(r, role="user") for r in user_rows if r.accepted]
        tokens.sort(key=lambda row: (row["t"], row["role"] == "user"))
        return {"run": {"predictors": predictors, "missing": [], "label": self.path.name}, "ep": shown,
                "tokens": tokens}

    def fit_platt(self) -> None:
        """Fit the cross-fitted Platt map of the verbal stream on the episodes summarised so far (Appendix D, via
        :func:`uqh.scoring.analyses.calibrated_stream`), unless it was fitted on as many already."""
        if self.reader is None or self.platt_for == len(self.summaries):
            return
        from uqh.reports.view.platt import platt_by_episode

        self.platt = platt_by_episode(self.reader, self.summaries, self.verbal)
        self.platt_for = len(self.summaries)

    def predictor_styles(self, *, with_derived: bool = True) -> list[dict[str, str]]:
        names = step_predictor_names()
        out = [{"key": p, "label": predictor_label(p), **style_of(i)} for i, p in enumerate(names)]
        out += [{"key": p, "label": predictor_label(p), **style_of(len(names) + i)}
                for i, p in enumerate(probe_predictor_names())]
        if with_derived:
            out.append({"key": f"{PRIMARY}_platt", "label": predictor_label(PRIMARY) + " (Platt)",
                        "color": style_of(0)["color"], "dash": PLATT_DASH})
            out.append({"key": BASE_RATE, "label": "Base rate ȳ", "color": BASE_RATE_STYLE[0],
                        "dash": BASE_RATE_STYLE[1]})
        return out


def base_rate(labels: list[int]) -> float | None:
    """ȳ of the clean episodes with an outcome, by the registry's base-rate predictor (None: no such episode)."""
    import numpy as np

    if not labels:
        return None
    return clean(PREDICTORS[BASE_RATE].constant(np.asarray(labels, dtype=float)))


def attach_qz(runs: list[ViewedRun]) -> None:
    """q_hat_Z of each continuation run's q_Z file onto the run it estimates (matched by config hash)."""
    bases = [r for r in runs if r.reader is not None and not r.reader.is_continuation]
    targets = [(r.path, r.reader.manifest.config_hash) for r in bases]
    for r in runs:
        qz_path = r.path / QZ_FILE
        if r.reader is None or not r.reader.is_continuation or not qz_path.is_file() or not targets:
            continue
        try:
            per_run = qz_for_runs([qz_path], targets)
        except UserError:
            continue  # the run it estimates is not among those shown
        for base, values in zip(bases, per_run):
            base.qz.update(values)


def attach_judgments(runs: list[ViewedRun], judge_dirs: list[Path]) -> list[str]:
    """Mean judge score per (run, episode, metric) from the judge directories onto the runs they judged (matched
    by path); returns one note per judge directory that could not be read."""
    by_path = {str(r.path.resolve()): r for r in runs}
    notes = []
    for d in judge_dirs:
        try:
            jd = JudgeDir.open(d)
            judgments = jd.judgments()
        except UserError as exc:
            notes.append(f"judge directory {d}: {exc}")
            continue
        sums: dict[tuple[int, str, str], list[int]] = {}
        for j in judgments:
            if j.score is not None:
                sums.setdefault((j.run, j.episode_id, j.metric.value), []).append(j.score)
        for (run_index, eid, metric), scores in sums.items():
            run = by_path.get(str(Path(jd.manifest.config.runs[run_index].path).resolve()))
            if run is not None:
                run.judged.setdefault(eid, {})[metric] = sum(scores) / len(scores)
    return notes




def attach_probes(runs: list[ViewedRun], probe_dirs: list[Path]) -> list[str]:
    """The per-step values of the probe directories onto the runs they probed (matched by config hash), as the
    predictor each probe feeds; returns one note per probe directory that could not be read."""
    by_hash = {r.reader.manifest.config_hash: r for r in runs if r.reader is not None}
    predictor_of = {p.probe: p for p in PREDICTORS.values() if p.probe is not None}
    notes = []
    for d in probe_dirs:
        try:
            pd = ProbeDir.open(d)
            predictor = predictor_of.get(pd.config.probe.value)
            if predictor is None:
                continue
            name = predictor.name
            for config_hash, run in by_hash.items():
                for (eid, t), v in pd.values_for_run(config_hash).items():
                    steps = run.probed.setdefault(eid, {}).setdefault(name, [])
                    steps.extend([None] * (t - len(steps)))
                    steps[t - 1] = predictor.probe_stream_value(v.value) if v.value is not None else None
        except UserError as exc:
            notes.append(f"probe directory {d}: {exc}")
    return notes


def steps_json(steps: list[Step]) -> list[dict[str, Any]]:
    """Steps as the shared transcript (trace_chart.js) draws them; repaired attempts kept."""
    return [{"t": st.t, "action": st.action, "obs": st.observation, "think": st.think,
             "explanation": st.explanation, "confidence": st.confidence_raw, "conf_raw": st.confidence_raw,
             "repairs": str(st.repair_attempts),
             "rejected": [{"attempt": a.attempt, "error": a.error, "raw": a.text_with_calls} for a in st.attempts if a.error]}
            for st in steps]


def episode_json(ep: Episode, values: dict[str, list[float | None]]) -> dict[str, Any]:
    """The trajectory as the shared chart and transcript (trace_chart.js) draw it; failed attempts kept."""
    return {"id": ep.episode_id, "task": ep.task_id, "text": ep.task_prompt, "stop": ep.stop_reason.value,
            "y": ep.outcome, "reward": ep.reward, "steps": steps_json(ep.steps), "values": values,
            "failed": [{"attempt": a.attempt, "error": a.error, "raw": a.text_with_calls} for a in (ep.failed_step or [])],
            "censored": ep.stop_reason == StopReason.max_steps}


def tokens_json(row: LogprobRow, role: str = "agent") -> dict[str, Any]:
    """One accepted completion's tokens: who generated it (``agent`` or the simulated ``user``), text,
    probability, top alternatives (text, probability); the action span as a half-open token range (null: unknown,
    or a user turn)."""
    tokens = []
    for tok in row.tokens or []:
        tokens.append({"s": tok.token, "p": math.exp(tok.logprob),
                       "top": [[alt.token, math.exp(alt.logprob)] for alt in tok.top_logprobs[:5]]})
    return {"t": row.t, "role": role, "attempt": row.attempt, "tokens": tokens if row.tokens is not None else None,
            "action": list(row.action_token_range) if row.action_token_range else None}
