"""Predictor streams from a run directory, and the (values, offsets, Y, Δ, q_Z) arrays they are scored on.

Reads the run directory only through :class:`rundir.RunDir`. Every registered per-step predictor
(:data:`uqh.scoring.registry.PREDICTORS`) is evaluated on every parsed step, from the step and the sidecar row of its
ACCEPTED attempt (the last accepted row of a step wins; no row -> ``None``); a trajectory predictor (self-
consistency) gives one value per episode, repeated along its steps; a constant predictor (the base rate) is
computed from the training labels of the scored sample (:mod:`uqh.scoring.labels`). Missing values (NaN) are never
imputed: a trajectory with any missing value is skipped for that predictor and counted (Appendix K, "Missing
predictor values").
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from uqh.rundir.errors import UserError
from uqh.rundir.probes import ProbeDir
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import CAPABILITY_TIERS, NO_LOGPROBS, Episode, LogprobRow, Manifest
from uqh.scoring.labels import DEFAULT_LABELS, label_convention, training_labels
from uqh.scoring import learned as learned_model, process_features, role_signals
from uqh.scoring.registry import PREDICTORS, get_predictor
from uqh.scoring.results import LearnedCalibration
from uqh.scoring.truth import TRUTH
from uqh.scoring.weights import DEFAULT_WEIGHTS, trajectory_weights

CENSORING_MODES = ("exclude", "simple", "exact")


def check_predictor(name: str) -> str:
    get_predictor(name)
    return name


# ------------------------------------------------------------------------------------------ run data


@dataclass
class RunData:
    """Everything scoring needs from one run directory, as arrays (one entry per episode / per parsed step)."""

    run_dir: Path
    manifest: Manifest
    episode_ids: np.ndarray  # object array of str
    stop_reason: np.ndarray  # object array of str (StopReason values)
    outcome: np.ndarray  # float: Y for clean episodes, NaN otherwise
    n_steps: np.ndarray  # int: parsed steps stored per episode
    step_budget: np.ndarray  # int
    offsets: np.ndarray  # int, len n+1 over the flat step arrays
    streams: dict[str, np.ndarray] = field(default_factory=dict)  # per-step predictor -> flat float (NaN = missing)
    task_ids: np.ndarray | None = None  # object array of str per episode (None: read from the episode ids)
    #: per parsed step, its logprob capability tier (uqh.rundir.schema.CAPABILITY_TIERS; None: not read)
    step_tier: np.ndarray | None = None
    #: whether the run recorded the simulated user's tokens (user_logprobs.jsonl): without them the user and
    #: combined per-role predictors are missing
    has_user_sidecar: bool = False
    #: per parsed step, the process signals of uqh.scoring.process_features (the HTC features are built from them)
    signals: np.ndarray | None = None
    #: (field, value) of each sidecar value read as missing because out of range (uqh.rundir.schema.MAX_LOGPROB)
    out_of_range_sidecar_values: list = field(default_factory=list)

    def tier_counts(self) -> dict[str, int]:
        """Parsed steps per logprob capability tier (full / selected_only / none)."""
        tiers = self.step_tier if self.step_tier is not None else np.zeros(0, dtype=object)
        return {t: int((tiers == t).sum()) for t in CAPABILITY_TIERS}

    @property
    def label(self) -> str:
        return str(self.run_dir)

    @property
    def tasks(self) -> np.ndarray:
        """The task id of every episode (``<task>#<sample>`` ids when the run did not record them)."""
        if self.task_ids is not None:
            return self.task_ids
        return np.array([str(e).rsplit("#", 1)[0] for e in self.episode_ids], dtype=object)

    def subset(self, mask: np.ndarray) -> "RunData":
        """The same run restricted to the episodes where ``mask`` is true (streams cut to their steps)."""
        mask = np.asarray(mask, dtype=bool)
        lengths = np.diff(self.offsets)
        step_mask = np.repeat(mask, lengths)
        return RunData(
            run_dir=self.run_dir, manifest=self.manifest, episode_ids=self.episode_ids[mask],
            stop_reason=self.stop_reason[mask], outcome=self.outcome[mask], n_steps=self.n_steps[mask],
            step_budget=self.step_budget[mask],
            offsets=np.concatenate([[0], np.cumsum(lengths[mask])]).astype(np.int64),
            streams={k: v[step_mask] for k, v in self.streams.items()}, task_ids=self.tasks[mask],
            step_tier=None if self.step_tier is None else self.step_tier[step_mask],
            has_user_sidecar=self.has_user_sidecar,
            signals=None if self.signals is None else self.signals[step_mask],
        )

    def count(self, stop_reason: str) -> int:
        """Episodes that stopped with ``stop_reason``."""
        return int((self.stop_reason == stop_reason).sum())

    def has_values(self, predictor: str) -> bool:
        """Whether any step has a (non-missing) value of ``predictor``."""
        return bool(np.isfinite(self.streams[predictor]).any())


def load_run(run_dir: "str | Path | RunDir", probes: Sequence[ProbeDir] = (), *,
             agentuq_conventions: bool = False) -> RunData:
    """Read a run directory (through :class:`rundir.RunDir`) into :class:`RunData`; UserError for bad input.
    ``probes``: probe directories (``uqh probe``) whose values for this run fill the probe predictors' streams.
    ``agentuq_conventions``: the per-role streams under agentuq's conventions (:func:`run_data_from_records`)."""
    reader = run_dir if isinstance(run_dir, RunDir) else RunDir.open(run_dir)
    if not reader.has_episodes_file:
        raise UserError(f"{reader.path} has no episodes yet (no finished episode); run `uqh run` first")
    episodes = reader.episodes()
    user_rows = reader.user_sidecar() if reader.has_user_sidecar else None
    other = (r for r in reader.sidecar() if not r.accepted) if agentuq_conventions else None
    data = run_data_from_records(reader.path, reader.manifest, episodes, (r for r in reader.sidecar() if r.accepted),
                                 user_rows=user_rows, other_rows=other)
    data.out_of_range_sidecar_values = list(reader.out_of_range_sidecar_values)
    fill_probe_streams(data, probes)
    return data


def fill_probe_streams(data: RunData, probes: Sequence[ProbeDir]) -> None:
    """Set each probe predictor's stream from the probe directories' values for this run (matched by config hash
    and ``(episode_id, t)``); steps without a value -- or with a recorded missing value -- stay NaN."""
    flat_index = {(str(eid), t): int(data.offsets[i]) + t - 1
                  for i, eid in enumerate(data.episode_ids) for t in range(1, int(data.n_steps[i]) + 1)}
    for p in PREDICTORS.values():
        if p.probe is None:
            continue
        stream = np.full(int(data.offsets[-1]), np.nan)
        for probe_dir in probes:
            if probe_dir.config.probe.value != p.probe:
                continue
            for (eid, t), v in probe_dir.values_for_run(data.manifest.config_hash).items():
                k = flat_index.get((eid, t))
                if k is not None and v.value is not None:
                    stream[k] = p.probe_stream_value(v.value)
        data.streams[p.name] = stream


def run_data_from_records(
    run_dir: Path, manifest: Manifest, episodes: list[Episode], accepted_rows: Iterable[LogprobRow],
    user_rows: Iterable[LogprobRow] | None = None, *, other_rows: Iterable[LogprobRow] | None = None,
) -> RunData:
    """Assemble :class:`RunData` from episodes (unique ids, as :meth:`rundir.RunDir.episodes` gives them) and the
    sidecar rows of accepted attempts (streamed: only the per-step values are kept, not the tokens); ``user_rows``:
    the user sidecar's rows (None: the run has none, so the user and combined per-role predictors are missing).

    ``other_rows`` (not None: agentuq's conventions, docs/scoring.md "uqh and agentuq"): the rejected calls' rows,
    which then count in the assistant's per-role terms; the per-role entropy is agentuq's (nats, a token without
    top-k counted with entropy 0); and the user's reply to the last action counts at the last step."""
    episodes = sorted(episodes, key=lambda e: e.episode_id)
    lengths = np.array([len(ep.steps) for ep in episodes], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    predictors = [p for p in PREDICTORS.values() if p.step_value is not None]
    streams = {p.name: np.full(int(offsets[-1]), np.nan) for p in predictors}
    pairs = [(ep.episode_id, step) for ep in episodes for step in ep.steps]  # flat step order
    steps = [step for _, step in pairs]
    where = {(eid, step.t): k for k, (eid, step) in enumerate(pairs)}  # (episode_id, t) -> flat index
    running = [p for p in PREDICTORS.values() if p.running is not None]
    terms = {p.name: np.full((int(offsets[-1]), 2), np.nan) for p in running}
    signals = np.full((len(steps), len(process_features.STEP_SIGNALS)), np.nan)
    has_row = np.zeros(len(steps), dtype=bool)
    step_tier = np.full(len(steps), NO_LOGPROBS, dtype=object)
    agentuq = other_rows is not None
    roles = RoleTerms(len(steps), agentuq)
    for row in accepted_rows:
        k = where.get((row.episode_id, row.t))
        if k is not None:  # a later accepted row of the same step overwrites
            roles.assistant_call(k, row.tokens)
            step_tier[k] = row.capability_tier
            for p in predictors:
                streams[p.name][k] = p.step_value(steps[k], row)
            for p in running:
                terms[p.name][k] = p.running.terms(steps[k], row)
            signals[k] = process_features.step_signals(steps[k], row)
            has_row[k] = True
    for k in np.flatnonzero(~has_row):
        for p in predictors:
            streams[p.name][k] = p.step_value(steps[k], None)
        for p in running:
            terms[p.name][k] = p.running.terms(steps[k], None)
        signals[k] = process_features.step_signals(steps[k], None)
    for row in other_rows or ():
        k = where.get((row.episode_id, row.t))
        if k is not None and has_row[k]:
            roles.other_assistant_call(k, row.tokens)
    process_features.fill_text_signals(signals, episodes)
    fill_signal_streams(streams, signals, offsets)
    for p in running:
        cum = cumulative_within(terms[p.name], offsets)
        streams[p.name] = np.asarray(p.running.confidence(cum[:, 0], cum[:, 1]), dtype=float)
    if user_rows is not None:
        place_user_turns(roles, user_rows, where, {ep.episode_id: len(ep.steps) for ep in episodes}, agentuq)
    roles.fill(streams, offsets, has_user_sidecar=user_rows is not None)
    if manifest is not None and manifest.config.decoding.temperature > 0:
        for p in PREDICTORS.values():  # greedy-only values of sampled tokens are not what they claim: missing
            if p.greedy_only:
                streams[p.name][:] = np.nan
    for p in PREDICTORS.values():
        if p.probe is not None:  # filled from probe directories by fill_probe_streams; missing without one
            streams[p.name] = np.full(int(offsets[-1]), np.nan)
        if p.is_trajectory:  # one value per episode, constant along its steps
            streams[p.name] = np.repeat(np.asarray(p.trajectory_value(episodes), dtype=float), lengths)
    return RunData(
        run_dir=Path(run_dir),
        manifest=manifest,
        episode_ids=np.array([ep.episode_id for ep in episodes], dtype=object),
        stop_reason=np.array([ep.stop_reason.value for ep in episodes], dtype=object),
        outcome=np.array(
            [float(ep.outcome) if (ep.stop_reason.value == "clean" and ep.outcome is not None) else np.nan for ep in episodes]
        ),
        n_steps=lengths,
        step_budget=np.array([ep.step_budget for ep in episodes], dtype=np.int64),
        offsets=offsets,
        streams=streams,
        task_ids=np.array([ep.task_id for ep in episodes], dtype=object),
        step_tier=step_tier,
        has_user_sidecar=user_rows is not None,
        signals=signals,
    )


def place_user_turns(roles: "RoleTerms", user_rows: Iterable[LogprobRow], where: dict, n_steps: dict[str, int],
                     agentuq: bool) -> None:
    """Add every user turn to the step whose information set holds it: row t answers step t's action, so it enters
    step t + 1 (the opening, t = 0, step 1); the reply to the last action enters none -- except under agentuq's
    conventions, whose trajectory summary counts it at the last step (docs/scoring.md)."""
    for row in user_rows:
        t = row.t + 1
        if agentuq and t == n_steps.get(row.episode_id, -1) + 1:
            t -= 1
        k = where.get((row.episode_id, t))
        if k is not None:
            roles.user_call(k, row.tokens)


def fill_signal_streams(streams: dict[str, np.ndarray], signals: np.ndarray, offsets: np.ndarray) -> None:
    """The streams of the predictors that run over the process signals (SAUP)."""
    for p in PREDICTORS.values():
        if p.signal_running is not None:
            cum = cumulative_within(p.signal_running.terms(signals), offsets)
            streams[p.name] = np.asarray(p.signal_running.confidence(cum[:, 0], cum[:, 1]), dtype=float)


class RoleTerms:
    """The per-step terms of the per-role predictors (:mod:`uqh.scoring.role_signals`), gathered call by call
    (``agentuq``: under agentuq's conventions, :func:`uqh.scoring.role_signals.with_conventions`)."""

    def __init__(self, n_steps: int, agentuq: bool = False) -> None:
        self.predictors = [p for p in PREDICTORS.values() if p.role is not None]
        self.roles = {p.name: role_signals.with_conventions(p.role, agentuq) for p in self.predictors}
        kinds = {(r.terms, r.accumulate) for r in self.roles.values()}
        self.assistant = {kind: np.full((n_steps, 2), np.nan) for kind in kinds}  # no accepted row: missing
        self.user = {kind: role_signals.empty_terms(n_steps, kind[1]) for kind in kinds}  # no user turn: nothing

    def assistant_call(self, k: int, tokens) -> None:
        for (terms, acc), arr in self.assistant.items():
            arr[k] = terms(tokens)

    def user_call(self, k: int, tokens) -> None:
        for (terms, acc), arr in self.user.items():
            arr[k] = role_signals.combine(arr[k : k + 1], np.array([terms(tokens)]), acc)[0]

    def other_assistant_call(self, k: int, tokens) -> None:
        """A repair or failed call of step k (agentuq counts every call): added to the accepted call's terms."""
        for (terms, acc), arr in self.assistant.items():
            arr[k] = role_signals.combine(arr[k : k + 1], np.array([terms(tokens)]), acc)[0]

    def fill(self, streams: dict[str, np.ndarray], offsets: np.ndarray, *, has_user_sidecar: bool) -> None:
        n = int(offsets[-1])
        for p in self.predictors:
            role = self.roles[p.name]
            kind = (role.terms, role.accumulate)
            if role.role != "assistant" and not has_user_sidecar:
                streams[p.name] = np.full(n, np.nan)
                continue
            per_step = {"assistant": self.assistant[kind], "user": self.user[kind]}.get(role.role)
            if per_step is None:
                per_step = role_signals.combine(self.assistant[kind], self.user[kind], role.accumulate)
            if role.accumulate == "max":
                cum = role_signals.running_max_within(per_step, offsets)
            else:
                cum = cumulative_within(per_step, offsets)
            streams[p.name] = np.asarray(role.confidence(cum[:, 0], cum[:, 1]), dtype=float)


def cumulative_within(terms: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Running sums of per-step ``terms`` (rows) restarting at every trajectory; a NaN stays NaN to the end of its
    trajectory (a step without tokens makes every later running value missing, never imputed)."""
    terms = np.asarray(terms, dtype=float)
    if terms.shape[0] == 0:
        return terms.copy()
    lengths = np.diff(offsets)
    finite = np.isfinite(terms)
    sums = np.cumsum(np.where(finite, terms, 0.0), axis=0)
    n_missing = np.cumsum(~finite, axis=0)
    start = offsets[:-1]  # the running totals just before each trajectory's first step
    sums_before = np.vstack([np.zeros((1, terms.shape[1])), sums])[start]
    missing_before = np.vstack([np.zeros((1, terms.shape[1]), dtype=np.int64), n_missing])[start]
    out = sums - np.repeat(sums_before, lengths, axis=0)
    out[(n_missing - np.repeat(missing_before, lengths, axis=0)) > 0] = np.nan
    return out


# ------------------------------------------------------------------------------------------ samples


@dataclass
class Sample:
    """The arrays one predictor row is scored on (flat values + offsets; per-trajectory Y, Δ, q_Z, horizon)."""

    predictor: str
    episode_ids: np.ndarray
    values: np.ndarray
    offsets: np.ndarray
    y: np.ndarray  # Y for complete trajectories, NaN for censored
    delta: np.ndarray  # True: outcome observed (complete); False: administratively censored
    q_z: np.ndarray  # q_hat_Z for censored trajectories under exact censoring, NaN otherwise
    horizon: np.ndarray  # evaluated horizon T_i used for the weights
    ybar: float  # mean Y of the working sample's complete trajectories
    counts: dict[str, int]
    label_convention: str = "complete"  # uqh.scoring.labels: what the base rate and Platt are trained on
    labels: np.ndarray | None = None  # per trajectory, the training label of that convention (NaN: not trained on)
    #: q_t of every scored step where the run records it on all of them (oracle domains), else None
    truth: np.ndarray | None = None
    #: a learned calibrator's inputs: the prefix features of every scored step (columns ``feature_names``) and the
    #: feature columns left out because the run records them on no step of the working sample
    features: np.ndarray | None = None
    feature_names: list[str] | None = None
    dropped_features: list[str] | None = None
    #: a learned calibrator's fit (its values are ``values``), or why it could not be fitted (then n = 0)
    learned_fit: LearnedCalibration | None = None
    learned_error: str | None = None

    @property
    def n(self) -> int:
        return int(self.offsets.size - 1)

    def subset(self, mask: np.ndarray) -> "Sample":
        mask = np.asarray(mask, dtype=bool)
        lengths = np.diff(self.offsets)
        step_mask = np.repeat(mask, lengths)
        new_off = np.concatenate([[0], np.cumsum(lengths[mask])]).astype(np.int64)
        return Sample(self.predictor, self.episode_ids[mask], self.values[step_mask], new_off, self.y[mask],
                      self.delta[mask], self.q_z[mask], self.horizon[mask], self.ybar, dict(self.counts),
                      self.label_convention, None if self.labels is None else self.labels[mask],
                      None if self.truth is None else self.truth[step_mask],
                      None if self.features is None else self.features[step_mask], self.feature_names,
                      self.dropped_features, self.learned_fit, self.learned_error)

    @property
    def label_mean(self) -> float:
        """Mean training label of the sample's training trajectories (the base rate under its convention)."""
        lab = self.labels[np.isfinite(self.labels)] if self.labels is not None else np.zeros(0)
        return float(lab.mean()) if lab.size else float("nan")


def greedy_refusal(run: RunData, predictor: str) -> str | None:
    """Why a greedy-only predictor (G-NLL) cannot be scored on ``run`` (sampled: temperature > 0), else None.
    AgentUQ computes G-NLL only under greedy decoding: on sampled tokens it is not the greedy sequence's NLL, so its
    stream on a sampled run is missing (:func:`run_data_from_records`) and `uqh score --predictor` refuses it."""
    temperature = run.manifest.config.decoding.temperature
    if get_predictor(predictor).greedy_only and temperature > 0:
        return (f"predictor {predictor} is greedy-only (G-NLL) but {run.run_dir} sampled at temperature "
                f"{temperature:g}; score it on a run with --temperature 0")
    return None


def working_mask(run: RunData, censoring: str, include_parse_errors: bool) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Which episodes enter scoring and which of them are censored, plus exclusion counts.

    clean -> complete (Δ=1); max_steps -> censored (Δ=0) unless ``censoring == "exclude"``; parse_error ->
    excluded (informative, Appendix G) unless ``include_parse_errors`` (the G.2 sensitivity analysis: censored at
    the failing step); tool_error / env_terminated -> excluded. Episodes without parsed steps are excluded.
    """
    if censoring not in CENSORING_MODES:
        raise UserError(f"unknown censoring {censoring!r}; use one of {', '.join(CENSORING_MODES)}")
    if include_parse_errors and censoring == "exclude":
        raise UserError("--include-parse-errors treats parse errors as censored; use it with --censoring simple or exact")
    sr = run.stop_reason
    clean = (sr == "clean") & np.isfinite(run.outcome)
    censored = np.zeros(sr.shape, dtype=bool)
    if censoring != "exclude":
        censored |= sr == "max_steps"
        if include_parse_errors:
            censored |= sr == "parse_error"
    has_steps = run.n_steps > 0
    keep = (clean | censored) & has_steps
    counts = {
        "episodes": int(sr.size),
        "complete": int((clean & has_steps).sum()),
        "censored": int((censored & has_steps).sum()),
        "excluded_max_steps": int(((sr == "max_steps") & ~censored).sum()),
        "excluded_parse_error": int(((sr == "parse_error") & ~censored).sum()),
        "excluded_tool_error": int((sr == "tool_error").sum()),
        "excluded_env_terminated": int((sr == "env_terminated").sum()),
        "excluded_clean_without_outcome": int(((sr == "clean") & ~np.isfinite(run.outcome)).sum()),
        "excluded_no_steps": int(((clean | censored) & ~has_steps).sum()),
        "parse_errors_included_as_censored": int(((sr == "parse_error") & censored & has_steps).sum()),
    }
    return keep, censored & keep, counts


@dataclass(frozen=True)
class LearnedSettings:
    """How a learned calibrator (HTC) is fitted: the penalty, the TPS weight schedule of its records, and the run it
    is fitted on (None: cross-fitted on the scored sample)."""

    penalty: str = "ridge"
    weights: str = DEFAULT_WEIGHTS
    calibrator_from: "RunData | None" = None


def build_sample(
    run: RunData,
    predictor: str,
    *,
    censoring: str = "exclude",
    q_z: dict[str, float] | None = None,
    include_parse_errors: bool = False,
    missing_qz: str = "error",
    labels: str = DEFAULT_LABELS,
    learned: LearnedSettings | None = None,
) -> Sample:
    """The scored arrays of one predictor on one run directory (:func:`unfitted_sample`); for a learned calibrator
    (HTC) its values fitted as ``learned`` says (default: ridge, linear-front, cross-fitted), so every consumer of a
    sample sees the calibrator's forecasts -- or, when it cannot be fitted, an empty sample with ``learned_error``."""
    sample = unfitted_sample(run, predictor, censoring=censoring, q_z=q_z, include_parse_errors=include_parse_errors,
                             missing_qz=missing_qz, labels=labels)
    if get_predictor(predictor).learned is None:
        return sample
    learned = learned or LearnedSettings()
    try:
        if sample.n == 0:
            raise ValueError("no trajectories to fit it on")
        return fit_learned(sample, learned, censoring=censoring, include_parse_errors=include_parse_errors,
                           labels=labels)
    except ValueError as exc:
        empty = sample.subset(np.zeros(sample.n, dtype=bool))
        empty.learned_error = f"{get_predictor(predictor).label} unavailable: {exc}"
        return empty


def fit_learned(sample: Sample, settings: LearnedSettings, *, censoring: str, include_parse_errors: bool,
                labels: str) -> Sample:
    """``sample`` with its learned calibrator's values: cross-fitted on the sample as Platt is, or one model fitted on
    ``settings.calibrator_from``'s sample of the same predictor (same censoring; ``exact`` becomes ``simple`` there,
    which needs no q_Z file) applied to every step. ValueError when it cannot be fitted."""
    w = trajectory_weights(sample.offsets, settings.weights, sample.horizon)
    source = settings.calibrator_from
    if source is None:
        values, models = learned_model.cross_fit(
            sample.features, sample.feature_names, sample.offsets, sample.y, sample.delta, sample.episode_ids, w,
            labels=sample.label_convention, q_z=sample.q_z, penalty=settings.penalty)
    else:
        src = unfitted_sample(source, sample.predictor, censoring="simple" if censoring == "exact" else censoring,
                              include_parse_errors=include_parse_errors, labels=labels)
        names = [n for n in sample.feature_names if n in set(src.feature_names)]
        if src.n == 0 or not names:
            raise ValueError(f"{source.label} has no scored trajectory with the features of this run")
        pick = [src.feature_names.index(n) for n in names]
        model = learned_model.fit_all(src.features[:, pick], names, src.offsets, src.y, src.delta,
                                      trajectory_weights(src.offsets, settings.weights, src.horizon),
                                      labels=src.label_convention, q_z=src.q_z, penalty=settings.penalty)
        values = model(sample.features[:, [sample.feature_names.index(n) for n in names]])
        models = (model,)
    names = list(models[0].features)
    dropped = [n for n in (sample.dropped_features or []) + sample.feature_names if n not in names]
    fit = learned_model.calibration_result(sample.predictor, names, dropped, settings.penalty, learned_model.LAMBDA,
                                           models, None if source is None else source.label)
    return dataclasses.replace(sample, values=np.asarray(values, dtype=float), learned_fit=fit)


def unfitted_sample(
    run: RunData,
    predictor: str,
    *,
    censoring: str = "exclude",
    q_z: dict[str, float] | None = None,
    include_parse_errors: bool = False,
    missing_qz: str = "error",
    labels: str = DEFAULT_LABELS,
) -> Sample:
    """The scored arrays of one predictor on one run directory (see :func:`working_mask` for the sample); a learned
    calibrator's values are not fitted yet (0 where it has its features: use :func:`build_sample`).

    Under ``censoring="exact"`` every censored episode needs a q_hat_Z in ``q_z``: a missing one is a UserError, or
    with ``missing_qz="exclude"`` the episode is excluded and counted (``excluded_no_qz``, e.g. prefixes the
    continuation audit did not retain, Appendix H.2). The
    evaluated horizon of every trajectory is its observed length (complete: the terminal length; natural
    censoring: the observed stop length, i.e. the budget for max_steps) -- §4.1. ``labels`` (``working`` or
    ``complete``) chooses, with ``censoring``, the label convention of :mod:`uqh.scoring.labels`: the training labels
    the base rate is the mean of (over the whole working sample, before per-predictor skipping) and Platt is fitted on.
    """
    spec = get_predictor(predictor)
    convention = label_convention(censoring, labels)
    if missing_qz not in ("error", "exclude"):
        raise UserError(f"unknown missing-q_Z policy {missing_qz!r}; use error or exclude")
    keep, censored, counts = working_mask(run, censoring, include_parse_errors)
    counts["excluded_no_qz"] = 0
    if censoring == "exact":
        if q_z is None:
            raise UserError("--censoring exact needs --q-z FILE (the q_Z file written by `uqh continue`)")
        no_q = censored & ~np.isin(run.episode_ids.astype(str), np.array(list(q_z), dtype=str))
        if no_q.any() and missing_qz == "error":
            first = str(run.episode_ids[np.flatnonzero(no_q)[0]])
            raise UserError(
                f"the q_Z file has no q_hat_z for {int(no_q.sum())} censored episode(s) of {run.run_dir} "
                f"(e.g. {first!r}); run `uqh continue` on them, pass --missing-qz exclude, or use --censoring simple"
            )
        keep = keep & ~no_q
        censored = censored & ~no_q
        counts["excluded_no_qz"] = int(no_q.sum())
        counts["censored"] -= int(no_q.sum())
    lengths = np.diff(run.offsets)
    complete = keep & ~censored
    ybar = float(np.mean(run.outcome[complete])) if complete.any() else float("nan")
    qz = np.full(lengths.size, np.nan)
    if censoring == "exact":
        for i in np.flatnonzero(censored):
            qz[i] = float(q_z[run.episode_ids[i]])
    y = np.where(censored, np.nan, run.outcome)
    target = np.full(lengths.size, np.nan)
    target[keep] = training_labels(y[keep], ~censored[keep], qz[keep], convention)
    features = names = dropped = None
    if spec.is_constant:
        flat = np.full(int(run.offsets[-1]), spec.constant(target[keep & np.isfinite(target)]))
    elif spec.learned is not None:
        flat, features, names, dropped = learned_inputs(run, keep)
    elif predictor in run.streams:
        flat = run.streams[predictor]
    else:
        raise ValueError(f"predictor {predictor!r} was registered after {run.run_dir} was loaded; load it again")
    traj_missing = np.zeros(lengths.size, dtype=bool)
    if lengths.sum():
        traj_of_step = np.repeat(np.arange(lengths.size), lengths)
        traj_missing = np.bincount(traj_of_step, weights=~np.isfinite(flat), minlength=lengths.size) > 0
    skipped = keep & traj_missing
    counts["skipped_missing"] = int(skipped.sum())
    use = keep & ~traj_missing
    counts["used"] = int(use.sum())
    counts["used_complete"] = int((use & ~censored).sum())
    counts["used_censored"] = int((use & censored).sum())
    step_use = np.repeat(use, lengths)
    truth = run.streams.get(TRUTH)
    truth = truth[step_use] if truth is not None else None
    return Sample(
        predictor=predictor,
        episode_ids=run.episode_ids[use],
        values=np.asarray(flat[step_use], dtype=float),
        offsets=np.concatenate([[0], np.cumsum(lengths[use])]).astype(np.int64),
        y=y[use],
        delta=~censored[use],
        q_z=qz[use],
        horizon=lengths[use].copy(),
        ybar=ybar,
        counts=counts,
        label_convention=convention,
        labels=target[use],
        truth=truth if truth is not None and truth.size and np.isfinite(truth).all() else None,
        features=None if features is None else features[step_use],
        feature_names=names,
        dropped_features=dropped,
    )


def learned_inputs(run: RunData, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """A learned calibrator's inputs on ``run``: (a stream that is 0 where every used feature has a value and NaN
    where one is missing -- the trajectory is then skipped and counted, as for any predictor --, the prefix features,
    the used feature names, the dropped ones). A feature is dropped when it is missing on every step of the
    working sample (the run does not record it, e.g. the logprob features of a run without logprobs)."""
    if run.signals is None:
        raise ValueError(f"{run.run_dir} was loaded without process signals; load it with load_run")
    feats = process_features.prefix_features(run.signals, run.offsets, run.step_budget)
    step_keep = np.repeat(keep, np.diff(run.offsets))
    used = np.isfinite(feats[step_keep]).any(axis=0) if step_keep.any() else np.zeros(feats.shape[1], dtype=bool)
    names = [n for n, u in zip(process_features.FEATURES, used) if u]
    dropped = [n for n, u in zip(process_features.FEATURES, used) if not u]
    feats = feats[:, used]
    flat = np.where(np.isfinite(feats).all(axis=1), 0.0, np.nan)
    return flat, feats, names, dropped


def episode_step_values(episode: Episode, rows: Iterable[LogprobRow]) -> dict[str, list[float]]:
    """Every registered per-step predictor's values along one episode's steps (NaN: missing), from the episode and
    its sidecar rows -- the values :func:`run_data_from_records` puts in the run's streams for this episode (the
    accepted row of a step is used; a later accepted row of the same step overwrites, as there). Trajectory
    predictors are left out: they need the whole run."""
    accepted = {row.t: row for row in rows if row.accepted}
    predictors = [p for p in PREDICTORS.values() if p.step_value is not None]
    return {p.name: [float(p.step_value(step, accepted.get(step.t))) for step in episode.steps] for p in predictors}
