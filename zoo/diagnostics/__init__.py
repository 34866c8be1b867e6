"""Owns the checks of a fitted posterior, in four modules by job:

* :mod:`zoo.inference_data`: every run as one ArviZ ``InferenceData`` (``posterior.nc``; below the pipeline, so
  that :meth:`zoo.BNN.to_inference_data` reaches it);
* :mod:`zoo.diagnostics.checks`: R-hat, ESS, divergences, BFMI, Pareto k-hat, their verdict, files and plots
  (``zoo diagnose``; the verdict that ends ``zoo train`` of MCMC draws);
* :mod:`zoo.diagnostics.comparison`: runs' predictives against a reference run's (``zoo compare``);
* :mod:`zoo.diagnostics.grow`: a many-chain HMC run grown in rounds until its verdict passes (``zoo train
  --add-draws N --until-converged``).

The names below are the package's public interface.
"""

from zoo.diagnostics.checks import (
    BFMI_MIN,
    DIAGNOSTICS_FILE,
    ESS_MIN,
    KHAT_MAX,
    RHAT_MAX,
    SUMMARY_FILE,
    check,
    diagnose,
    diagnose_report,
    diagnosis,
    guide_log_density,
    jsonable,
    khat_interpretation,
    pareto_k,
    sampler_checks,
    verdict,
)
from zoo.diagnostics.comparison import (
    COMPARE_DRAWS,
    ReferenceStanding,
    RunPredictive,
    compare,
    compare_predictives,
    compare_table,
    reference_standing,
    run_predictive,
    trusted_reference,
)
from zoo.diagnostics.grow import (
    NOT_CONVERGED_EXIT,
    ConvergenceVerdict,
    GrowResult,
    check_growth,
    convergence_verdict,
    grow_until_converged,
)
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
    "BFMI_MIN", "COMPARE_DRAWS", "DIAGNOSTICS_FILE", "ESS_MIN", "INFERENCE_DATA_FILE", "KHAT_MAX",
    "NOT_CONVERGED_EXIT", "RHAT_MAX", "SUMMARY_FILE", "VI_DRAWS", "ConvergenceVerdict", "GrowResult",
    "ReferenceStanding", "RunPredictive", "check", "check_growth", "compare", "compare_predictives", "compare_table",
    "convergence_verdict", "diagnose", "diagnose_report", "diagnosis", "grow_until_converged", "guide_log_density",
    "jsonable", "khat_interpretation", "log_joint", "pareto_k", "pointwise_log_likelihood", "reference_standing",
    "run_predictive", "sampler_checks", "save_inference_data", "site_dims", "to_inference_data", "trusted_reference",
    "verdict",
]
