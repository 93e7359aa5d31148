"""Golden numbers of the pre-typed scoring pipeline (commit 06261ab, scoring.tables.score_run returning dicts).

Run with that commit's packages on sys.path (e.g. from /work/main at 06261ab):
    python make_pre_typed_golden.py OUT.json
The records name metrics the typed way (registry name + score family) so the test needs no key parsing.
"""
import json, sys
sys.path.insert(0, "tests")
from pathlib import Path
import tempfile
from scoring_fixtures import synthetic_run
from scoring.streams import load_run
from scoring.tables import ScoreOptions, score_run
from scoring.rules import parse_score

SCORES = ("log", "brier", "beta(2,4)", "beta(1,3)")
def typed(k):
    for s in SCORES:
        if k == f"tps_{s}": return "tps", s
        if k == f"tps_{s}_complete_only": return "tps_complete_only", s
        if k == f"delta_practice_{s}": return "delta_practice", s
    return k, None

tmp = Path(tempfile.mkdtemp())
run = load_run(synthetic_run(tmp / "syn", n=40, censored=6, parse_errors=3, seed=7))
cens = [e for e, s in zip(run.episode_ids, run.stop_reason) if s == "max_steps"]
q = {e: (k + 1) / 10 for k, e in enumerate(cens)}
CONFIGS = {
    "exclude": dict(censoring="exclude", fixed_rank=True),
    "simple": dict(censoring="simple"),
    "exact": dict(censoring="exact", q_z=q),
    "uniform": dict(censoring="simple", weights="uniform", scores=("log", "beta:1,3")),
}
PREDS = ("verbal", "base_rate")
recs = []
for name, kw in CONFIGS.items():
    kw = dict(kw)
    if "scores" in kw:
        kw["scores"] = tuple(parse_score(s) for s in kw["scores"])
    res = score_run(run, ScoreOptions(n_bootstrap=40, seed=3, predictors=PREDS, **kw))
    for r in res["rows"]:
        where = dict(options=name, table="rows", predictor=r["predictor"], calibration=r["calibration"])
        for k, m in r["metrics"].items():
            metric, score = typed(k)
            fields = {"value": m["value"]}
            if "ci" in m:
                fields.update(ci_low=m["ci"][0], ci_high=m["ci"][1], se=m["se"])
            for f, v in fields.items():
                recs.append({**where, "metric": metric, "score": score, "field": f, "number": v})
        for k, c in (r.get("vs_raw") or {}).items():
            metric, score = typed(k)
            for f, v in (("delta", c["delta"]), ("se", c["se"]), ("delta_over_se", c["delta_over_se"]),
                         ("ci_low", c["ci"][0]), ("ci_high", c["ci"][1])):
                recs.append({**where, "metric": metric, "score": score, "field": "vs_raw." + f, "number": v})
        for f in ("n_used", "n_complete", "n_censored", "n_skipped_missing", "ybar"):
            recs.append({**where, "metric": None, "score": None, "field": f, "number": r[f]})
    for r in res["auq"]:
        if r["predictor"] != "verbal" or r["aggregator"] != "avg":
            continue
        for k, m in r["metrics"].items():
            where = dict(options=name, table="auq:" + r["aggregator"], predictor=r["predictor"], calibration=r["calibration"])
            for f, v in (("value", m["value"]), ("ci_low", m["ci"][0]), ("ci_high", m["ci"][1]), ("se", m["se"])):
                recs.append({**where, "metric": k, "score": None, "field": f, "number": v})
    for p, d in res["calibration"].items():
        for split in ("split_A", "split_B"):
            for f in ("a", "b", "b_fitted", "mu", "sigma", "ybar_train"):
                recs.append(dict(options=name, table="calibration", predictor=p, calibration=split, metric=None,
                                 score=None, field=f, number=d[split][f]))
    for p, rows in (res.get("fixed_rank") or {}).items():
        for r in rows:
            for k, v in r.items():
                if k != "transform":
                    metric, score = typed(k)
                    recs.append(dict(options=name, table="fixed_rank", predictor=p, calibration=r["transform"],
                                     metric=metric, score=score, field="value", number=v))
    for k, v in res["counts"].items():
        recs.append(dict(options=name, table="counts", predictor=None, calibration=None, metric=None, score=None,
                         field=k, number=v))
out = {"generated_by": "scoring.tables.score_run at commit 06261ab (dict results, before the typed models)",
       "fixture": "synthetic_run(n=40, censored=6, parse_errors=3, seed=7); q_hat_z = (k+1)/10 for the k-th censored id",
       "bootstrap": 40, "seed": 3, "predictors": list(PREDS)}
cols = ["options", "table", "predictor", "calibration", "metric", "score", "field", "number"]
out["columns"] = cols
out["records"] = [[r[c] for c in cols] for r in recs]
Path(sys.argv[1]).write_text(json.dumps(out, separators=(",", ":")).replace("],[", "],\n["))
print(len(recs))
