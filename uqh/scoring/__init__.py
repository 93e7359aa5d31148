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
- regimes:     :func:`sign_regime`, :func:`margin_over_base_rate`, :func:`mean_forecast`, :func:`margin_change`
                                                                                                  -- App. I.2, Tables 13–14
- artificial:  :func:`length_stratified_censoring`, :func:`artificial_censoring_analysis`         -- App. I.1
- termination: :func:`termination_counts`, :func:`selection_diagnostic`                            -- App. G.1, Fig. 2B
- q_Z:         :func:`uqh.scoring.qz.run_estimate.estimate_qz` (continuation runs -> q_hat_Z + audit)          -- App. H
               :func:`uqh.scoring.qz.prefixes.censored_prefix_audit` (every predictor over the retained
               prefixes; plug-in bias)                                             -- App. H.2 Tables 7–9, C.4/C.5
- certify:     :func:`certify_items`, :class:`CertifyItem`, :class:`CertifyOptions`, :class:`CertifyResult`;
               conformal pieces :func:`rank_scores`, :func:`cp_scores`, :func:`conformal_threshold`,
               :func:`reliability_level`, :func:`wilson_interval`                              -- Mouzouni, "Black-box reliability certification", §2, §6, §7

Run directories are read only through :mod:`rundir`; nothing of the harness, domains or reports is imported.

Every public name stays bound to its function whatever was imported first: ``uqh.scoring.tps`` is the function
:func:`uqh.scoring.tps.tps`, even after the submodule of the same name was imported (reach the module's other names with
``from uqh.scoring.tps import ...``).
"""
from __future__ import annotations

import importlib
import sys
import types

# Lazy re-exports: `uqh --help` imports scoring.command, which must not pull in numpy/scipy.
_EXPORTS = {
    "compare": "uqh.scoring.bootstrap",
    "interval": "uqh.scoring.bootstrap",
    "paired_bootstrap": "uqh.scoring.bootstrap",
    "resample_counts": "uqh.scoring.bootstrap",
    "standard_error": "uqh.scoring.bootstrap",
    "CertifyItem": "uqh.scoring.certify.certificate",
    "CertifyOptions": "uqh.scoring.certify.certificate",
    "certify_items": "uqh.scoring.certify.certificate",
    "CertifyResult": "uqh.scoring.certify.certificate_results",
    "conformal_threshold": "uqh.scoring.certify.conformal",
    "cp_scores": "uqh.scoring.certify.conformal",
    "rank_scores": "uqh.scoring.certify.conformal",
    "reliability_level": "uqh.scoring.certify.conformal",
    "wilson_interval": "uqh.scoring.certify.conformal",
    "CrossFitResult": "uqh.scoring.calibration",
    "PlattMap": "uqh.scoring.calibration",
    "cross_fit_platt": "uqh.scoring.calibration",
    "fit_platt": "uqh.scoring.calibration",
    "stratified_split": "uqh.scoring.calibration",
    "LABEL_CONVENTIONS": "uqh.scoring.labels",
    "label_convention": "uqh.scoring.labels",
    "training_labels": "uqh.scoring.labels",
    "ScalarDiagnostics": "uqh.scoring.diagnostics",
    "auprc": "uqh.scoring.diagnostics",
    "aurc": "uqh.scoring.diagnostics",
    "auroc": "uqh.scoring.diagnostics",
    "phi_avg": "uqh.scoring.diagnostics",
    "phi_last": "uqh.scoring.diagnostics",
    "phi_min": "uqh.scoring.diagnostics",
    "scalarized_loss": "uqh.scoring.diagnostics",
    "t_brier": "uqh.scoring.diagnostics",
    "t_ece": "uqh.scoring.diagnostics",
    "trajectory_scalar": "uqh.scoring.diagnostics",
    "fixed_rank_analysis": "uqh.scoring.fixed_rank",
    "ScoreRule": "uqh.scoring.rules",
    "parse_score": "uqh.scoring.rules",
    "censored_shift": "uqh.scoring.analyses",
    "calibrated_stream": "uqh.scoring.analyses",
    "exact_vs_simple": "uqh.scoring.analyses",
    "parse_error_sensitivity": "uqh.scoring.analyses",
    "artificial_censoring_analysis": "uqh.scoring.artificial",
    "margin_change": "uqh.scoring.regimes",
    "margin_over_base_rate": "uqh.scoring.regimes",
    "mean_forecast": "uqh.scoring.regimes",
    "sign_regime": "uqh.scoring.regimes",
    "length_stratified_censoring": "uqh.scoring.artificial",
    "ScoreOptions": "uqh.scoring.pipeline",
    "evaluate_predictor": "uqh.scoring.pipeline",
    "pool_runs": "uqh.scoring.pipeline",
    "score_run": "uqh.scoring.pipeline",
    "METRICS": "uqh.scoring.registry",
    "Metric": "uqh.scoring.registry",
    "MetricKey": "uqh.scoring.registry",
    "PREDICTORS": "uqh.scoring.registry",
    "Predictor": "uqh.scoring.registry",
    "register_metric": "uqh.scoring.registry",
    "register_predictor": "uqh.scoring.registry",
    "unregister_metric": "uqh.scoring.registry",
    "unregister_predictor": "uqh.scoring.registry",
    "AuqResult": "uqh.scoring.results",
    "Estimate": "uqh.scoring.results",
    "FixedRankRow": "uqh.scoring.results",
    "PlattDiagnostics": "uqh.scoring.results",
    "PredictorResult": "uqh.scoring.results",
    "RunScores": "uqh.scoring.results",
    "selection_diagnostic": "uqh.scoring.termination",
    "termination_counts": "uqh.scoring.termination",
    "entropy_confidence": "uqh.scoring.step_values",
    "token_probability": "uqh.scoring.step_values",
    "RunData": "uqh.scoring.streams",
    "Sample": "uqh.scoring.streams",
    "build_sample": "uqh.scoring.streams",
    "load_run": "uqh.scoring.streams",
    "artificial_censoring": "uqh.scoring.tps",
    "exact_minus_simple_log": "uqh.scoring.tps",
    "posterior_weight": "uqh.scoring.tps",
    "tps": "uqh.scoring.tps",
    "tps_censored_exact": "uqh.scoring.tps",
    "tps_censored_simple": "uqh.scoring.tps",
    "WEIGHT_SCHEMES": "uqh.scoring.weights",
    "step_weights": "uqh.scoring.weights",
    "trajectory_weights": "uqh.scoring.weights",
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
    package (``setattr(scoring, "tps", <module uqh.scoring.tps>)``), which would hide a public name of the same name --
    ``uqh.scoring.tps(...)`` would stop being callable depending on import order. Such bindings are skipped; the
    submodule stays in ``sys.modules`` (``from uqh.scoring.tps import ...`` and ``importlib.import_module`` work)."""

    def __setattr__(self, name: str, value) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
