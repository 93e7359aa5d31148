"""What `uqh view` knows of each run while it serves: read through :class:`uqh.rundir.reader.RunDir` only, cached,
and brought up to date by reading what was appended since the last request.

- the run list row (:meth:`ViewedRun.overview`) comes from the manifest and the episodes file's line index (stop
  reason, outcome and cost of each finished episode, read from its line without parsing the record);
- the trajectory list (:meth:`ViewedRun.trajectories`) parses finished episodes in chunks, in file order, and keeps
  one small summary per episode (its task text clipped, its last value of every per-step predictor);
- one trajectory (:meth:`ViewedRun.trajectory`) reads one episode and its sidecar rows at their indexed offsets.

A run that cannot be read (a bad manifest, a line that is not a record) is kept in the list with its one-line
error: one bad run never hides the good ones. Every method is called with the run's lock held (one thread at a
time per reader: the server runs them off its event loop). Each run has three readers, each with its own line
indexes and lock -- the run list's, the trajectory list's and the trajectory page's -- so that none waits for
another (the trajectory list parses episodes a chunk at a time, in the background too, for the Platt fit).
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uqh.rundir.errors import UserError
from uqh.rundir.judgments import JudgeDir
from uqh.rundir.probes import ProbeDir
from uqh.rundir.qz_file import qz_for_runs
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import QZ_FILE, Episode, LogprobRow, StopReason
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
    reader: RunDir | None = None
    #: A second reader for the run list (its own index of the episodes file, its own lock): the list never waits
    #: for a trajectory-list chunk being parsed.
    list_reader: RunDir | None = None
    #: A third for the trajectory page (its own indexes and lock): a trajectory never waits for the list's chunks.
    page_reader: RunDir | None = None
    error: str | None = None
    summaries: list[dict[str, Any]] = field(default_factory=list)
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

    @classmethod
    def open(cls, key: str, path: Path) -> "ViewedRun":
        run = cls(key=key, path=path)
        try:
            opened = RunDir.open(path)
            run.list_reader = opened
            run.reader = RunDir(path=opened.path, manifest=opened.manifest, index_heads=False)
            run.page_reader = RunDir(path=opened.path, manifest=opened.manifest, index_heads=False)
        except UserError as exc:
            run.error = str(exc)
        return run

    # ------------------------------------------------------------------ the run list

    def overview(self) -> dict[str, Any]:
        """The run list row: domain, model, done/planned, stop-reason counts, base rate, cost, state (call with
        ``list_lock`` held)."""
        if self.list_reader is None:
            return {"key": self.key, "path": str(self.path), "error": self.error}
        try:
            index = self.list_reader.episode_index()
            heads = [index.heads[e] for e in index.order]
            planned = self.list_reader.planned
        except (UserError, OSError) as exc:
            return {"key": self.key, "path": str(self.path), "error": str(exc)}
        stops: dict[str, int] = {}
        for h in heads:
            stops[h.stop_reason] = stops.get(h.stop_reason, 0) + 1
        labels = [h.outcome for h in heads if h.stop_reason == "clean" and h.outcome is not None]
        costs = [h.cost_usd for h in heads if h.cost_usd is not None]
        config = self.list_reader.config
        running = self.list_reader.is_being_written()
        return {
            "key": self.key, "path": str(self.path), "error": None, "domain": config.domain, "model": config.model,
            "kind": "continuation" if self.list_reader.is_continuation else "run",
            "done": len(heads), "planned": planned, "stops": stops,
            "base_rate": base_rate(labels), "cost_usd": sum(costs) if costs else None,
            "state": "running" if running else ("finished" if len(heads) >= planned else "stopped"),
            "notes": index.notes + [f"episodes.jsonl line {n}: {why}" for n, why in index.bad_lines],
        }

    # ------------------------------------------------------------------ the trajectory list

    def trajectories(self, since: int) -> dict[str, Any]:
        """Summaries of the finished episodes from position ``since`` on (file order), at most
        :data:`SUMMARY_CHUNK` newly parsed; ``done`` is how many episodes have finished by now."""
        if self.reader is None:
            raise UserError(self.error or "unreadable run")
        index = self.reader.episode_index()
        ids = index.order
        while len(self.summaries) < len(ids) and len(self.summaries) < since + SUMMARY_CHUNK:
            eid = ids[len(self.summaries)]
            ep = self.reader.episode(eid, refresh=False)
            if ep is None:  # the file was rewritten under the index (re-indexed): the next request continues
                break
            self.summaries.append(self._summary(ep))
        return {"since": since, "items": self.summaries[since:], "done": len(ids),
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
        """One finished episode with every per-step predictor, the Platt stream (when fitted), the base rate, its
        transcript, judge scores and q_hat_Z, and the tokens of each step's accepted completion; None when it has
        not finished (call with ``page_lock`` held)."""
        if self.page_reader is None:
            raise UserError(self.error or "unreadable run")
        ep = self.page_reader.episode(episode_id)
        if ep is None:
            return None
        rows = self.page_reader.episode_sidecar_rows(episode_id)
        values = {p: [clean(v) for v in vals] for p, vals in episode_step_values(ep, rows).items()}
        notes = list(self.page_reader.sidecar_index().notes)
        for name, per_t in self.probed.get(episode_id, {}).items():  # probe values, drawn like any stream
            values[name] = [clean(v) if v is not None else None for v in per_t]
        if episode_id in self.platt and self.platt_for >= 0:
            values[f"{PRIMARY}_platt"] = self.platt[episode_id]
        with self.list_lock:
            listed = self.overview()
        ybar = listed.get("base_rate")
        if ybar is not None:
            values[BASE_RATE] = [ybar] * len(ep.steps)
        predictors = [p for p in self.predictor_styles() if p["key"] in values]
        if ybar is not None:
            predictors[-1] = {**predictors[-1], "label": f"Base rate ȳ = {ybar:.3f}"}
        accepted = {r.t: r for r in rows if r.accepted}
        missing_rows = [s.t for s in ep.steps if s.t not in accepted]
        if missing_rows:
            notes.append(f"no accepted sidecar row for step(s) {', '.join(map(str, missing_rows))}: their token "
                         "predictors are missing (a sidecar cut short, or a provider without logprobs)")
        # the user's turns (Tau2 with --user-logprobs) after the agent's step of the same t: the opening is t = 0,
        # the reply to step t's message is the observation of step t
        tokens = [tokens_json(accepted[t]) for t in sorted(accepted)]
        tokens += [tokens_json(r, role="user") for r in self.page_reader.episode_user_sidecar_rows(episode_id)
                   if r.accepted]
        tokens.sort(key=lambda row: (row["t"], row["role"] == "user"))
        return {"run": {"predictors": predictors, "missing": [], "label": self.path.name},
                "ep": episode_json(ep, values), "tokens": tokens,
                "judged": self.judged.get(episode_id), "q_hat_z": self.qz.get(episode_id), "notes": notes,
                "platt_pending": self.platt_for != listed.get("done")}

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


def episode_json(ep: Episode, values: dict[str, list[float | None]]) -> dict[str, Any]:
    """The trajectory as the shared chart and transcript (trace_chart.js) draw it; failed attempts kept."""
    steps = []
    for st in ep.steps:
        steps.append({"t": st.t, "action": st.action, "obs": st.observation, "think": st.think,
                      "explanation": st.explanation, "confidence": st.confidence_raw, "conf_raw": st.confidence_raw,
                      "repairs": str(st.repair_attempts),
                      "rejected": [{"attempt": a.attempt, "error": a.error, "raw": a.raw_text}
                                   for a in st.attempts if a.error]})
    return {"id": ep.episode_id, "task": ep.task_id, "text": ep.task_prompt, "stop": ep.stop_reason.value,
            "y": ep.outcome, "reward": ep.reward, "steps": steps, "values": values,
            "failed": [{"attempt": a.attempt, "error": a.error, "raw": a.raw_text} for a in (ep.failed_step or [])],
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
