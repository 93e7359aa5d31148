"""The long-format records of a :class:`uqh.scoring.results.RunScores` (``uqh score --format csv`` and the report's
``scores_long__<run>.csv``): one record per row and metric, named by registry names. The tables people read are
arranged in :mod:`uqh.reports.score_view`."""
from __future__ import annotations

from uqh.scoring.results import RunScores

CSV_FIELDS = ("run_dir", "table", "predictor", "calibration", "aggregator", "metric", "score", "value", "ci_low",
              "ci_high", "se", "n_used", "n_complete", "n_censored", "n_skipped_missing", "censoring",
              "label_convention")


def csv_records(result: RunScores) -> list[dict]:
    """Long-format records: one per (row, metric); ``metric`` is the registry name, ``score`` the score family;
    every record carries the censoring mode and the label convention the numbers were computed under."""
    settings = {"censoring": result.settings.censoring, "label_convention": result.settings.label_convention}
    recs = []
    for row in result.rows:
        for m in row.metrics:
            e = m.estimate
            recs.append({"run_dir": result.run_dir, "table": "predictors", "predictor": row.predictor,
                         "calibration": row.calibration, "aggregator": "", "metric": m.metric, "score": m.score or "",
                         "value": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high, "se": e.se,
                         "n_used": row.n_used, "n_complete": row.n_complete, "n_censored": row.n_censored,
                         "n_skipped_missing": row.n_skipped_missing, **settings})
    for row in result.auq:
        for m in row.metrics:
            e = m.estimate
            recs.append({"run_dir": result.run_dir, "table": "auq", "predictor": row.predictor,
                         "calibration": row.calibration, "aggregator": row.aggregator, "metric": m.metric,
                         "score": m.score or "", "value": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high,
                         "se": e.se, "n_used": row.n, "n_complete": row.n, "n_censored": 0, "n_skipped_missing": "",
                         **settings})
    return recs
