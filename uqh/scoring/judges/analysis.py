"""The GPA-judge analysis: judge directories (``uqh judge``) to typed :class:`JudgeAnalysis` results.

Reads the judge directory and its judged runs only through :mod:`rundir` and computes, per judge (metric):

- **score distributions** by stop reason and outcome (clean Y=1 / Y=0, max_steps, parse_error, ...);
- **stability across repeats** (Agent GPA §4.1.4): each repeat a rater, Krippendorff's α (ordinal, with a
  bootstrap CI over episodes; interval, the paper's level) and the mean per-episode SD (:mod:`uqh.scoring.judges.agreement`);
- **failure prediction** next to the agent's confidence streams: failure-oriented AUROC/AUPRC (positive class
  Y = 0, :class:`uqh.scoring.diagnostics.ScalarDiagnostics`) on the judged complete episodes (clean, Y observed -- the
  sample ``uqh score`` uses) of each judge's mean score over repeats, of the GPA mean (the mean of those over
  every judge; an episode lacking one is skipped and counted), and of each registered per-step confidence
  predictor's linear-front weighted trajectory mean (:mod:`uqh.scoring.streams`, as in ``uqh score``); each judge
  row also carries its paired-bootstrap difference to verbal confidence on the episodes both have;
- **step localisation**: in failed episodes (clean, Y = 0) whose verbal confidence drops somewhere, the share of
  judgments whose cited steps include the first step t >= 2 with c_t < c_{t-1}, next to the share expected if
  as many steps were cited at random;
- **human agreement** with ``--labels``: exact and within-one agreement, Cohen's κ (unweighted and quadratic).

All runs of a judge directory are pooled into one sample (judge runs separately for per-run figures).
A missing judgment (score null) is counted, never imputed.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from uqh.rundir.errors import UserError
from uqh.rundir.judgments import MAX_SCORE, HumanLabel, JudgeDir, JudgeManifest, JudgeMetric, Judgment, read_labels_file
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import Episode, StopReason
from uqh.scoring.judges.agreement import alpha_from_coincidences, cohen_kappa, exact_agreement, krippendorff_alpha, \
    unit_coincidences, unit_value_counts, within_one_agreement
from uqh.scoring.bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED, compare, interval, paired_bootstrap, standard_error
from uqh.scoring.diagnostics import ScalarDiagnostics, trajectory_scalar
from uqh.scoring.judges.judge_results import (
    ALL_METRICS,
    GPA_MEAN,
    GROUPS,
    FailurePredictionRow,
    HumanAgreementRow,
    JudgeAnalysis,
    JudgeCounts,
    LocalisationRow,
    ScoreDistributionRow,
    StabilityRow,
)
from uqh.scoring.registry import predictor_label, step_predictors
from uqh.scoring.results import Comparison, Estimate, finite_or_none
from uqh.scoring.streams import build_sample, load_run
from uqh.scoring.weights import DEFAULT_WEIGHTS, trajectory_weights

EpisodeKey = tuple[int, str]  # (judged run index, episode_id)
SCORE_VALUES = np.arange(MAX_SCORE + 1, dtype=float)
VERBAL = "verbal"




# ------------------------------------------------------------------------------------------ loading


@dataclass
class JudgeData:
    """A judge directory and what the analysis needs from its judged runs."""

    path: Path
    manifest: JudgeManifest
    judgments: list[Judgment]
    duplicate_lines: int
    episodes: dict[EpisodeKey, Episode]  # every finished episode of the judged runs
    #: per-step confidence predictor -> {episode: weighted trajectory mean}, complete trajectories only
    confidence: dict[str, dict[EpisodeKey, float]]


def load_judge_data(judge_dir: str | Path) -> JudgeData:
    """Read a judge directory and its judged runs (UserError when a run is gone or no longer the judged one)."""
    jd = JudgeDir.open(judge_dir)
    episodes: dict[EpisodeKey, Episode] = {}
    confidence: dict[str, dict[EpisodeKey, float]] = defaultdict(dict)
    for k, run in enumerate(jd.config.runs):
        try:
            reader = RunDir.open(run.path)
        except UserError as exc:
            raise UserError(f"the judged run {run.path} cannot be read ({exc})") from None
        if reader.manifest.config_hash != run.config_hash:
            raise UserError(f"{run.path} is no longer the run that was judged (its config hash changed)")
        for ep in reader.episodes():
            episodes[(k, ep.episode_id)] = ep
        data = load_run(reader)
        for name in step_predictors():
            sample = build_sample(data, name)  # complete trajectories without a missing value
            if sample.n == 0:
                continue
            w = trajectory_weights(sample.offsets, DEFAULT_WEIGHTS, sample.horizon)
            scalars = trajectory_scalar(sample.values, sample.offsets, w)
            for eid, c in zip(sample.episode_ids, scalars):
                confidence[name][(k, str(eid))] = float(c)
    return JudgeData(Path(judge_dir), jd.manifest, jd.judgments(), jd.duplicate_lines, episodes, dict(confidence))


def present_metrics(judgments: list[Judgment]) -> list[JudgeMetric]:
    """The judges that have judgments, in the canonical GF..TC order."""
    seen = {j.metric for j in judgments}
    return [m for m in JudgeMetric if m in seen]


def episode_group(ep: Episode) -> str:
    if ep.stop_reason == StopReason.clean:
        return "clean, no Y" if ep.outcome is None else f"clean, Y={ep.outcome}"
    return ep.stop_reason.value


def is_complete(ep: Episode | None) -> bool:
    return ep is not None and ep.stop_reason == StopReason.clean and ep.outcome is not None


# ------------------------------------------------------------------------------------------ counts, distributions


def judge_counts(judgments: list[Judgment], duplicate_lines: int = 0) -> JudgeCounts:
    calls = prompt = completion = unpriced = 0
    cost = 0.0
    for j in judgments:
        for a in j.attempts:
            calls += 1
            prompt += a.call.usage.prompt_tokens or 0
            completion += a.call.usage.completion_tokens or 0
            if a.call.cost_usd is None:
                unpriced += 1
            else:
                cost += a.call.cost_usd
    scored = sum(j.score is not None for j in judgments)
    return JudgeCounts(
        judgments=len(judgments), scored=scored, missing=len(judgments) - scored,
        repaired=sum(j.score is not None and len(j.attempts) > 1 for j in judgments),
        episodes=len({(j.run, j.episode_id) for j in judgments}), duplicate_lines=duplicate_lines,
        calls=calls, prompt_tokens=prompt, completion_tokens=completion,
        cost_usd=None if calls and unpriced == calls else cost, unpriced_calls=unpriced,
    )


def score_distributions(judgments: list[Judgment], episodes: dict[EpisodeKey, Episode]) -> list[ScoreDistributionRow]:
    """Per judge x episode group: judgments, missing, counts of each score and the mean score."""
    cells: dict[tuple[JudgeMetric, str], list[Judgment]] = defaultdict(list)
    for j in judgments:
        ep = episodes.get((j.run, j.episode_id))
        cells[(j.metric, episode_group(ep) if ep is not None else "episode not in run")].append(j)
    rows = []
    order = {g: i for i, g in enumerate(GROUPS)}
    for (metric, group), js in sorted(cells.items(), key=lambda kv: (list(JudgeMetric).index(kv[0][0]),
                                                                        order.get(kv[0][1], len(order)))):
        scores = np.array([j.score for j in js if j.score is not None], dtype=float)
        rows.append(ScoreDistributionRow(
            metric=metric.value, group=group, n_judgments=len(js), n_missing=len(js) - scores.size,
            counts=[int((scores == v).sum()) for v in SCORE_VALUES], mean=finite_or_none(scores.mean()) if scores.size else None,
        ))
    return rows


# ------------------------------------------------------------------------------------------ stability


def ratings_matrix(judgments: list[Judgment], metric: JudgeMetric) -> tuple[list[EpisodeKey], np.ndarray]:
    """(episodes, ratings): one row per judged episode, one column per repeat, NaN where missing."""
    js = [j for j in judgments if j.metric == metric]
    units = sorted({(j.run, j.episode_id) for j in js})
    index = {u: i for i, u in enumerate(units)}
    repeats = max((j.repeat for j in js), default=-1) + 1
    r = np.full((len(units), max(repeats, 1)), np.nan)
    for j in js:
        if j.score is not None:
            r[index[(j.run, j.episode_id)], j.repeat] = j.score
    return units, r


def stability(judgments: list[Judgment], metrics: list[JudgeMetric], *, n_bootstrap: int = DEFAULT_RESAMPLES,
              seed: int = DEFAULT_SEED) -> list[StabilityRow]:
    rows = []
    for metric in metrics:
        _, r = ratings_matrix(judgments, metric)
        valid = np.isfinite(r).sum(axis=1)
        pairable = r[valid >= 2]
        per_unit = unit_coincidences(unit_value_counts(pairable, SCORE_VALUES))
        alpha = Estimate(value=finite_or_none(alpha_from_coincidences(per_unit, SCORE_VALUES, "ordinal")))
        if pairable.shape[0] >= 2 and n_bootstrap > 0 and alpha.value is not None:
            boots = paired_bootstrap(
                lambda counts: {"a": alpha_from_coincidences(per_unit, SCORE_VALUES, "ordinal", counts)},
                pairable.shape[0], n_bootstrap, seed)["a"]
            lo, hi = interval(boots)
            alpha = Estimate(value=alpha.value, ci_low=finite_or_none(lo), ci_high=finite_or_none(hi), se=finite_or_none(standard_error(boots)))
        sds = [np.std(row[np.isfinite(row)], ddof=1) for row in pairable]
        identical = [np.ptp(row[np.isfinite(row)]) == 0 for row in pairable]
        rows.append(StabilityRow(
            metric=metric.value, n_episodes=int(pairable.shape[0]), n_ratings=int(np.isfinite(pairable).sum()),
            max_repeats=int(valid.max()) if valid.size else 0, alpha_ordinal=alpha,
            alpha_interval=finite_or_none(krippendorff_alpha(pairable, "interval", SCORE_VALUES)) if pairable.size else None,
            mean_sd=finite_or_none(np.mean(sds)) if sds else None,
            share_identical=finite_or_none(np.mean(identical)) if identical else None,
        ))
    return rows


# ------------------------------------------------------------------------------------------ failure prediction


def judge_values(judgments: list[Judgment], metrics: list[JudgeMetric]) -> dict[str, dict[EpisodeKey, float]]:
    """Per judge: each episode's mean valid score over repeats, scaled to [0, 1] (score / 3); and the GPA mean
    (the mean of those over ``metrics``, only for episodes that have every one)."""
    sums: dict[str, dict[EpisodeKey, list[float]]] = defaultdict(lambda: defaultdict(list))
    for j in judgments:
        if j.score is not None:
            sums[j.metric.value][(j.run, j.episode_id)].append(j.score / MAX_SCORE)
    out = {m.value: {k: float(np.mean(v)) for k, v in sums[m.value].items()} for m in metrics}
    if metrics:
        keys = set.intersection(*(set(out[m.value]) for m in metrics))
        out[GPA_MEAN] = {k: float(np.mean([out[m.value][k] for m in metrics])) for k in keys}
    return out


def _diagnostics(c: np.ndarray, y: np.ndarray, n_bootstrap: int, seed: int):
    diag = ScalarDiagnostics(c, y)
    point = {k: float(v[0]) for k, v in diag.compute(None, ("auroc", "auprc")).items()}
    boots = paired_bootstrap(lambda counts: diag.compute(counts, ("auroc", "auprc")), c.size, n_bootstrap, seed) \
        if n_bootstrap > 0 and c.size else {}
    return point, boots


def _estimate(point: float, boots: np.ndarray | None) -> Estimate:
    if boots is None:
        return Estimate(value=finite_or_none(point))
    lo, hi = interval(boots)
    return Estimate(value=finite_or_none(point), ci_low=finite_or_none(lo), ci_high=finite_or_none(hi), se=finite_or_none(standard_error(boots)))


def _comparison(pa: float, pb: float, ba: np.ndarray | None, bb: np.ndarray | None) -> Comparison:
    if ba is None or bb is None or finite_or_none(pa) is None or finite_or_none(pb) is None:
        return Comparison(delta=finite_or_none(pb - pa) if finite_or_none(pa) is not None and finite_or_none(pb) is not None else None)
    c = compare(pa, pb, ba, bb)
    return Comparison(delta=finite_or_none(c["delta"]), se=finite_or_none(c["se"]), delta_over_se=finite_or_none(c["delta_over_se"]),
                      ci_low=finite_or_none(c["ci"][0]), ci_high=finite_or_none(c["ci"][1]))


def failure_prediction(
    judgments: list[Judgment],
    episodes: dict[EpisodeKey, Episode],
    confidence: dict[str, dict[EpisodeKey, float]],
    metrics: list[JudgeMetric],
    *,
    n_bootstrap: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> list[FailurePredictionRow]:
    """AUROC/AUPRC for Y = 0 of every judge, the GPA mean and every confidence stream on the judged complete
    episodes; judge rows with their paired difference to verbal confidence."""
    judged = sorted({(j.run, j.episode_id) for j in judgments if is_complete(episodes.get((j.run, j.episode_id)))})
    y_of = {k: float(episodes[k].outcome) for k in judged}
    values = judge_values(judgments, metrics)
    predictors: list[tuple[str, str, str, dict[EpisodeKey, float]]] = [
        (m.value, m.label, "judge", values[m.value]) for m in metrics]
    if len(metrics) > 1:
        predictors.append((GPA_MEAN, "GPA mean (all judges)", "judge", values[GPA_MEAN]))
    predictors += [(p, predictor_label(p), "confidence", confidence[p]) for p in step_predictors() if p in confidence]
    verbal = confidence.get(VERBAL, {})
    rows = []
    for name, label, kind, vals in predictors:
        keys = [k for k in judged if k in vals]
        c = np.array([vals[k] for k in keys])
        y = np.array([y_of[k] for k in keys])
        point, boots = _diagnostics(c, y, n_bootstrap, seed) if keys else ({"auroc": np.nan, "auprc": np.nan}, {})
        row = FailurePredictionRow(
            predictor=name, label=label, kind=kind, n=len(keys), n_failures=int((y == 0).sum()),
            n_skipped_missing=len(judged) - len(keys),
            auroc=_estimate(point["auroc"], boots.get("auroc")), auprc=_estimate(point["auprc"], boots.get("auprc")),
        )
        if kind == "judge" and verbal:
            both = [k for k in keys if k in verbal]
            if both:
                yb = np.array([y_of[k] for k in both])
                cj, cv = np.array([vals[k] for k in both]), np.array([verbal[k] for k in both])
                dj, dv = ScalarDiagnostics(cj, yb), ScalarDiagnostics(cv, yb)

                def joint(counts, dj=dj, dv=dv):
                    a, b = dv.compute(counts, ("auroc", "auprc")), dj.compute(counts, ("auroc", "auprc"))
                    return {"v_auroc": a["auroc"], "v_auprc": a["auprc"], "j_auroc": b["auroc"], "j_auprc": b["auprc"]}

                pts = {k: float(v[0]) for k, v in joint(np.ones((1, len(both)))).items()}
                bs = paired_bootstrap(joint, len(both), n_bootstrap, seed) if n_bootstrap > 0 else {}
                row.vs_verbal_n = len(both)
                row.vs_verbal_auroc = _comparison(pts["v_auroc"], pts["j_auroc"], bs.get("v_auroc"), bs.get("j_auroc"))
                row.vs_verbal_auprc = _comparison(pts["v_auprc"], pts["j_auprc"], bs.get("v_auprc"), bs.get("j_auprc"))
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------ localisation


def first_confidence_drop(confidences: list[float | None]) -> int | None:
    """The first step t >= 2 (1-based) whose verbal confidence is below the previous step's (both numeric)."""
    for t in range(1, len(confidences)):
        prev, cur = confidences[t - 1], confidences[t]
        if prev is not None and cur is not None and cur < prev:
            return t + 1
    return None


def localisation(judgments: list[Judgment], episodes: dict[EpisodeKey, Episode],
                 metrics: list[JudgeMetric]) -> list[LocalisationRow]:
    """Per judge, and for the union of all judges' cited steps per repeat ("all"): see :class:`LocalisationRow`."""
    failed = {k: ep for k, ep in episodes.items() if is_complete(ep) and ep.outcome == 0}
    by_episode: dict[EpisodeKey, list[Judgment]] = defaultdict(list)
    for j in judgments:
        if j.score is not None and (j.run, j.episode_id) in failed:
            by_episode[(j.run, j.episode_id)].append(j)
    drops = {k: first_confidence_drop(failed[k].verbal_confidences) for k in by_episode}

    def row(name: str, groups: dict[EpisodeKey, list[tuple[set[int], int]]]) -> LocalisationRow:
        """``groups``: episode -> [(cited steps, n_steps)] of its judgments (or repeats, for "all")."""
        shares, chances, cited = [], [], []
        for k, items in groups.items():
            cited += [len(c) for c, _ in items]
            t = drops[k]
            if t is None:
                continue
            shares.append(np.mean([t in c for c, _ in items]))
            chances.append(np.mean([len(c) / n if n else 0.0 for c, n in items]))
        return LocalisationRow(metric=name, n_failed=len(groups), n_with_drop=len(shares),
                               share=finite_or_none(np.mean(shares)) if shares else None,
                               chance=finite_or_none(np.mean(chances)) if chances else None,
                               mean_cited=finite_or_none(np.mean(cited)) if cited else None)

    rows = []
    for metric in metrics:
        groups = {k: [(set(j.cited_steps), j.n_steps) for j in js if j.metric == metric]
                  for k, js in by_episode.items()}
        rows.append(row(metric.value, {k: v for k, v in groups.items() if v}))
    if len(metrics) > 1:
        union: dict[EpisodeKey, list[tuple[set[int], int]]] = {}
        for k, js in by_episode.items():
            per_repeat: dict[int, set[int]] = defaultdict(set)
            for j in js:
                per_repeat[j.repeat] |= set(j.cited_steps)
            union[k] = [(c, failed[k].n_steps) for _, c in sorted(per_repeat.items())]
        rows.append(row(ALL_METRICS, union))
    return rows


# ------------------------------------------------------------------------------------------ human labels


def resolve_labels(labels: list[HumanLabel], run_paths: list[str], episodes: dict[EpisodeKey, Episode]
                   ) -> dict[tuple[EpisodeKey, str], int]:
    """(episode, metric) -> human score; UserError for a label of an unknown episode or run, or an ambiguous one."""
    runs_of: dict[str, list[int]] = defaultdict(list)
    for (k, eid) in episodes:
        runs_of[eid].append(k)
    out: dict[tuple[EpisodeKey, str], int] = {}
    for lab in labels:
        if lab.run is None:
            ks = runs_of.get(lab.episode_id, [])
            if len(ks) > 1:
                raise UserError(f"label for {lab.episode_id}: that episode id is in several judged runs; add a run "
                                "column (run index, directory path or name)")
        else:
            k = _run_index(lab.run, run_paths)
            ks = [k] if (k, lab.episode_id) in episodes else []
        if not ks:
            raise UserError(f"label for episode {lab.episode_id!r}: no such episode in the judged runs")
        key = ((ks[0], lab.episode_id), lab.metric.value)
        if key in out:
            raise UserError(f"two labels for {lab.episode_id} {lab.metric.value}")
        out[key] = lab.score
    return out


def _run_index(run: str, run_paths: list[str]) -> int:
    if run.isdigit() and int(run) < len(run_paths):
        return int(run)
    for k, p in enumerate(run_paths):
        if run == p or run == Path(p).name or Path(run).resolve() == Path(p):
            return k
    raise UserError(f"label run {run!r} is not a judged run; use its index (0..{len(run_paths) - 1}), directory "
                    "path or directory name")


def human_agreement(judgments: list[Judgment], labels: dict[tuple[EpisodeKey, str], int],
                    metrics: list[JudgeMetric]) -> list[HumanAgreementRow]:
    """Per judge and pooled ("all"): every valid repeat paired with the human label of its episode and metric."""
    scores: dict[tuple[EpisodeKey, str], list[int]] = defaultdict(list)
    for j in judgments:
        if j.score is not None:
            scores[((j.run, j.episode_id), j.metric.value)].append(j.score)
    names = [m.value for m in metrics]
    names += [m for m in sorted({m for (_, m) in labels}) if m not in names]
    rows = []
    for name in names + [ALL_METRICS]:
        keys = [k for k in labels if name == ALL_METRICS or k[1] == name]
        if not keys:
            continue
        pairs = [(labels[k], s) for k in keys for s in scores.get(k, [])]
        h = np.array([p[0] for p in pairs], dtype=float)
        j = np.array([p[1] for p in pairs], dtype=float)
        rows.append(HumanAgreementRow(
            metric=name, n_labels=len(keys), n_unjudged=sum(1 for k in keys if not scores.get(k)), n_pairs=len(pairs),
            exact=finite_or_none(exact_agreement(h, j)), within_one=finite_or_none(within_one_agreement(h, j)),
            kappa=finite_or_none(cohen_kappa(h, j, SCORE_VALUES)), kappa_quadratic=finite_or_none(cohen_kappa(h, j, SCORE_VALUES, "quadratic")),
        ))
    return rows


# ------------------------------------------------------------------------------------------ everything


def analyse_judgments(judge_dir: str | Path, *, labels_file: str | Path | None = None,
                      n_bootstrap: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> JudgeAnalysis:
    """Every analysis of one judge directory (see the module docstring)."""
    labels = read_labels_file(labels_file) if labels_file is not None else None  # bad input fails before work
    data = load_judge_data(judge_dir)
    if not data.judgments:
        raise UserError(f"{judge_dir} holds no judgments yet; run `uqh judge` without --report first")
    js, eps = data.judgments, data.episodes
    metrics = present_metrics(js)
    run_paths = [r.path for r in data.manifest.config.runs]
    notes = []
    orphans = sum((j.run, j.episode_id) not in eps for j in js)
    if orphans:
        notes.append(f"{orphans} judgments are of episodes no longer in their run: left out of outcome analyses")
    human = None
    if labels is not None:
        human = human_agreement(js, resolve_labels(labels, run_paths, eps), metrics)
    return JudgeAnalysis(
        judge_dir=str(data.path), judge_model=data.manifest.config.judge_model, runs=run_paths,
        metrics=[m.value for m in metrics], bootstrap=n_bootstrap, seed=seed,
        counts=judge_counts(js, data.duplicate_lines),
        distributions=score_distributions(js, eps),
        stability=stability(js, metrics, n_bootstrap=n_bootstrap, seed=seed),
        failure_prediction=failure_prediction(js, eps, data.confidence, metrics, n_bootstrap=n_bootstrap, seed=seed),
        localisation=localisation(js, eps, metrics),
        human=human, notes=notes,
    )
