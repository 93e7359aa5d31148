"""Scoring: pure numpy functions from run directories to the paper's numbers.

Public API (arrays are flat per-step ``values`` + per-trajectory ``offsets``; see docs/scoring.md):

- rules:       :class:`ScoreRule`, :func:`parse_score` (``log``, ``brier``, ``beta:A,B``)       -- §3, App. J
- weights:     :func:`trajectory_weights`, :func:`step_weights`, ``WEIGHT_SCHEMES``              -- §4.1, App. I
- TPS:         :func:`tps`, :func:`tps_censored_exact`, :func:`tps_censored_simple`,
               :func:`exact_minus_simple_log`, :func:`artificial_censoring`, :func:`posterior_weight`
                                                                                                  -- Eqs. 2, 4–6, 17
- registry:    ``METRICS``, ``PREDICTORS``, :class:`Metric`, :class:`Predictor`, :class:`MetricKey`,
               :func:`register_metric`, :func:`register_predictor` (one entry per metric / predictor)
- signals:     :func:`token_probability`, :func:`entropy_confidence` (per-step token values)        -- App. F
- streams:     :func:`load_run`, :func:`build_sample`, :class:`RunData`, :class:`Sample`          -- App. F, K
- calibration: :func:`cross_fit_platt`, :func:`fit_platt`, :func:`stratified_split`              -- App. D
- labels:      :func:`label_convention`, :func:`training_labels`, ``LABEL_CONVENTIONS`` (what the base rate and
               Platt are trained on under censoring)                                             -- Prop. C.2, C.3, §6.3
- diagnostics: :class:`ScalarDiagnostics`, :func:`auroc`, :func:`auprc`, :func:`aurc`, :func:`t_ece`,
               :func:`t_brier`, :func:`trajectory_scalar`, :func:`phi_last`, :func:`phi_avg`, :func:`phi_min`
                                                                                                  -- §5.1, App. B, F
- bootstrap:   :func:`paired_bootstrap`, :func:`resample_counts`, :func:`compare`, :func:`interval`
- fixed rank:  :func:`fixed_rank_analysis`                                                        -- App. E
- pipeline:    :class:`ScoreOptions`, :func:`score_run`, :func:`evaluate_predictor`, :func:`pool_runs`
- results:     :class:`RunScores`, :class:`PredictorResult`, :class:`AuqResult`, :class:`Estimate`, ... (pydantic)
- analyses:    :func:`censored_shift`, :func:`exact_vs_simple`, :func:`parse_error_sensitivity`,
               :func:`calibrated_stream`                                                          -- §4.3, §6.3, G.2
- artificial:  :func:`length_stratified_censoring`, :func:`artificial_censoring_analysis`         -- App. I.1
- termination: :func:`termination_counts`, :func:`selection_diagnostic`                            -- App. G.1, Fig. 2B
- q_Z:         :func:`scoring.qz_audit.estimate_qz` (continuation runs -> q_hat_Z + audit)          -- App. H
- certify:     :func:`certify_items`, :class:`CertifyItem`, :class:`CertifyOptions`, :class:`CertifyResult`;
               conformal pieces :func:`rank_scores`, :func:`cp_scores`, :func:`conformal_threshold`,
               :func:`reliability_level`, :func:`wilson_interval`                              -- seed 002 §2, §6, §7

Run directories are read only through :mod:`rundir`; nothing of the harness, domains or reports is imported.

Every public name stays bound to its function whatever was imported first: ``scoring.tps`` is the function
:func:`scoring.tps.tps`, even after the submodule of the same name was imported (reach the module's other names with
``from scoring.tps import ...``).
"""
from __future__ import annotations

import importlib
import sys
import types

# Lazy re-exports: `uqh --help` imports scoring.command, which must not pull in numpy/scipy.
_EXPORTS = {
    "compare": "scoring.bootstrap",
    "interval": "scoring.bootstrap",
    "paired_bootstrap": "scoring.bootstrap",
    "resample_counts": "scoring.bootstrap",
    "standard_error": "scoring.bootstrap",
    "CertifyItem": "scoring.certify",
    "CertifyOptions": "scoring.certify",
    "certify_items": "scoring.certify",
    "CertifyResult": "scoring.certify_results",
    "conformal_threshold": "scoring.conformal",
    "cp_scores": "scoring.conformal",
    "rank_scores": "scoring.conformal",
    "reliability_level": "scoring.conformal",
    "wilson_interval": "scoring.conformal",
    "CrossFitResult": "scoring.calibration",
    "PlattMap": "scoring.calibration",
    "cross_fit_platt": "scoring.calibration",
    "fit_platt": "scoring.calibration",
    "stratified_split": "scoring.calibration",
    "LABEL_CONVENTIONS": "scoring.labels",
    "label_convention": "scoring.labels",
    "training_labels": "scoring.labels",
    "ScalarDiagnostics": "scoring.diagnostics",
    "auprc": "scoring.diagnostics",
    "aurc": "scoring.diagnostics",
    "auroc": "scoring.diagnostics",
    "phi_avg": "scoring.diagnostics",
    "phi_last": "scoring.diagnostics",
    "phi_min": "scoring.diagnostics",
    "scalarized_loss": "scoring.diagnostics",
    "t_brier": "scoring.diagnostics",
    "t_ece": "scoring.diagnostics",
    "trajectory_scalar": "scoring.diagnostics",
    "fixed_rank_analysis": "scoring.fixed_rank",
    "ScoreRule": "scoring.rules",
    "parse_score": "scoring.rules",
    "censored_shift": "scoring.analyses",
    "calibrated_stream": "scoring.analyses",
    "exact_vs_simple": "scoring.analyses",
    "parse_error_sensitivity": "scoring.analyses",
    "artificial_censoring_analysis": "scoring.artificial",
    "length_stratified_censoring": "scoring.artificial",
    "ScoreOptions": "scoring.pipeline",
    "evaluate_predictor": "scoring.pipeline",
    "pool_runs": "scoring.pipeline",
    "score_run": "scoring.pipeline",
    "METRICS": "scoring.registry",
    "Metric": "scoring.registry",
    "MetricKey": "scoring.registry",
    "PREDICTORS": "scoring.registry",
    "Predictor": "scoring.registry",
    "register_metric": "scoring.registry",
    "register_predictor": "scoring.registry",
    "unregister_metric": "scoring.registry",
    "unregister_predictor": "scoring.registry",
    "AuqResult": "scoring.results",
    "Estimate": "scoring.results",
    "FixedRankRow": "scoring.results",
    "PlattDiagnostics": "scoring.results",
    "PredictorResult": "scoring.results",
    "RunScores": "scoring.results",
    "selection_diagnostic": "scoring.termination",
    "termination_counts": "scoring.termination",
    "entropy_confidence": "scoring.signals",
    "token_probability": "scoring.signals",
    "RunData": "scoring.streams",
    "Sample": "scoring.streams",
    "build_sample": "scoring.streams",
    "load_run": "scoring.streams",
    "artificial_censoring": "scoring.tps",
    "exact_minus_simple_log": "scoring.tps",
    "posterior_weight": "scoring.tps",
    "tps": "scoring.tps",
    "tps_censored_exact": "scoring.tps",
    "tps_censored_simple": "scoring.tps",
    "WEIGHT_SCHEMES": "scoring.weights",
    "step_weights": "scoring.weights",
    "trajectory_weights": "scoring.weights",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'scoring' has no attribute {name!r}")


def __dir__():
    return __all__


class _Package(types.ModuleType):
    """The ``scoring`` package object. Importing a submodule makes the import system bind it as an attribute of the
    package (``setattr(scoring, "tps", <module scoring.tps>)``), which would hide a public name of the same name --
    ``scoring.tps(...)`` would stop being callable depending on import order. Such bindings are skipped; the
    submodule stays in ``sys.modules`` (``from scoring.tps import ...`` and ``importlib.import_module`` work)."""

    def __setattr__(self, name: str, value) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
