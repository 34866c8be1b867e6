"""Owns the checks of a fitted posterior and the comparison with the exact one, in modules by job:

* :mod:`zoo.inference_data`: every run as one ArviZ ``InferenceData`` (``posterior.nc``; below the pipeline, so
  that :meth:`zoo.BNN.to_inference_data` reaches it);
* :mod:`zoo.posterior_checks`: R-hat, ESS, divergences, BFMI, Pareto k-hat, their verdict, files and plots, as a
  :class:`~zoo.posterior_checks.Diagnosis` (below :class:`zoo.BNN`, whose ``diagnose()`` runs them);
* :mod:`zoo.diagnostics.checks`: the same on a run directory (``zoo diagnose``; the verdict that ends ``zoo train``
  of MCMC draws);
* :mod:`zoo.diagnostics.grow`: a many-chain HMC run grown in rounds until its verdict passes (``zoo train
  --add-draws N --until-converged``);
* :mod:`zoo.diagnostics.reference`: :func:`zoo.reference`, that growth from a user's net and data in one call;
* :mod:`zoo.diagnostics.comparison`: :func:`zoo.compare`, fits' predictives against a reference's (``zoo
  compare``).

The names below are the package's public interface.
"""

from zoo.diagnostics.checks import (
    BFMI_MIN,
    DIAGNOSTICS_FILE,
    ESS_MIN,
    KHAT_MAX,
    RHAT_MAX,
    SUMMARY_FILE,
    Diagnosis,
    check,
    diagnose,
    diagnose_report,
    diagnosis,
    diagnosis_of,
    draws_would_help,
    energy_exploration,
    guide_log_density,
    jsonable,
    khat_interpretation,
    lp_moves_with,
    pareto_k,
    run_diagnosis,
    sampler_checks,
    verdict,
)
from zoo.diagnostics.comparison import (
    COMPARE_DRAWS,
    Comparison,
    ReferenceStanding,
    RunPredictive,
    compare,
    compare_predictives,
    compare_table,
    fit_predictive,
    reference_standing,
    run_predictive,
    standing_of,
    trusted_reference,
)
from zoo.diagnostics.grow import (
    NOT_CONVERGED_EXIT,
    ConvergenceVerdict,
    GrowResult,
    check_growth,
    check_value,
    convergence_verdict,
    estimated_draws,
    grow_until_converged,
    still_to_go,
    verdict_of,
)
from zoo.diagnostics.reference import budget_minutes, reference
from zoo.inference_data import (
    INFERENCE_DATA_FILE,
    VI_DRAWS,
    log_joint,
    pointwise_log_likelihood,
    save_inference_data,
    site_dims,
    to_inference_data,
)

__all__ = [
    "BFMI_MIN", "COMPARE_DRAWS", "Comparison", "ConvergenceVerdict", "DIAGNOSTICS_FILE", "Diagnosis", "ESS_MIN",
    "GrowResult", "INFERENCE_DATA_FILE", "KHAT_MAX", "NOT_CONVERGED_EXIT", "RHAT_MAX", "ReferenceStanding",
    "RunPredictive", "SUMMARY_FILE", "VI_DRAWS", "budget_minutes", "check", "check_growth", "check_value", "compare",
    "compare_predictives", "compare_table", "convergence_verdict", "diagnose", "diagnose_report", "diagnosis",
    "diagnosis_of", "draws_would_help", "energy_exploration", "estimated_draws", "fit_predictive",
    "grow_until_converged", "guide_log_density", "jsonable", "khat_interpretation", "log_joint", "lp_moves_with",
    "pareto_k", "pointwise_log_likelihood", "reference", "reference_standing", "run_diagnosis", "run_predictive",
    "sampler_checks", "save_inference_data", "site_dims", "standing_of", "still_to_go", "to_inference_data",
    "trusted_reference", "verdict", "verdict_of",
]
