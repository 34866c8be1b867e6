"""Name -> constructor tables for every swappable part; ``zoo list`` prints them and the spec checks names here."""

from __future__ import annotations

from typing import get_args

from guides.delta import DeltaGuide
from guides.dropout import DropoutGuide
from guides.full_rank import FullRankGuide
from guides.laplace import LaplaceGuide
from guides.mean_field import MeanFieldNormalGuide
from guides.mixture import BatchEnsembleGuide, MixtureGuide
from zoo.data import DATASETS
from zoo.errors import ZooInputError
from zoo.inference.elbo import ELBOS
from zoo.inference.laplace import LaplacePosterior, fit_laplace
from zoo.inference.mcmc import fit_mcmc
from zoo.inference.svi import fit_svi
from zoo.likelihoods import LIKELIHOODS
from zoo.models.deterministic import DeepEnsemble
from zoo.models.mean_field import MeanFieldBNN
from zoo.models.rank1 import Rank1BNN
from zoo.models.subnetwork import SELECTIONS, SubnetworkBNN
from zoo.nets import ACTIVATIONS, NETS
from zoo.posterior import GuidePosterior
from zoo.spec import PriorConfig

PRIORS = {get_args(cls.model_fields["name"].annotation)[0]: cls for cls in get_args(get_args(PriorConfig)[0])}
FAMILIES = {"mean_field": MeanFieldBNN, "rank1": Rank1BNN, "deep_ensemble": DeepEnsemble, "subnetwork": SubnetworkBNN}
GUIDES = {"mean_field": MeanFieldNormalGuide, "delta": DeltaGuide, "mixture": MixtureGuide,
          "batch_ensemble": BatchEnsembleGuide, "dropout": DropoutGuide, "full_rank": FullRankGuide,
          "laplace": LaplaceGuide}
# Which guides fit which family's latent structure (a guide outside this list is refused up front): the mixture
# and BatchEnsemble guides need ensemble members; MC dropout masks plain weight matrices (mean-field sites); a deep
# ensemble is K MAP fits (Delta only); the subnetwork is one vector site, so a full-covariance Gaussian fits it
# (Laplace, or SVI with full_rank).
FAMILY_GUIDES = {"mean_field": ("mean_field", "delta", "dropout"),
                 "rank1": ("mixture", "batch_ensemble", "mean_field", "delta"),
                 "deep_ensemble": ("delta",),
                 "subnetwork": ("laplace", "full_rank", "mean_field", "delta")}
INFERENCE = {"svi": fit_svi, "nuts": fit_mcmc, "hmc": fit_mcmc, "laplace": fit_laplace}
# How a run directory's fitted guide becomes its posterior again (MCMC runs store draws instead)
GUIDE_POSTERIORS = {"svi": lambda family, guide, spec: GuidePosterior(family, guide),
                    "laplace": LaplacePosterior.from_spec}

TABLES = {
    "data sets": DATASETS,
    "nets": {name: fn.__doc__.splitlines()[0] for name, fn in NETS.items()},
    "activations": {name: cls.__name__ for name, cls in ACTIVATIONS.items()},
    "priors": {name: cls.__doc__.splitlines()[0] for name, cls in PRIORS.items()},
    "families": {name: cls.__doc__.splitlines()[0] for name, cls in FAMILIES.items()},
    "guides": {name: cls.__doc__.splitlines()[0] for name, cls in GUIDES.items()},
    "likelihoods": {name: cls.__doc__.splitlines()[0] for name, cls in LIKELIHOODS.items()},
    "elbos": {"trace_mean_field": "analytic KL where registered, Monte Carlo elsewhere (default)",
              "trace": "Monte Carlo KL everywhere"},
    "inference": {"svi": fit_svi.__doc__.splitlines()[0],
                  "nuts": "NUTS (Pyro's kernel) on the family's model, chain after chain; the gold standard",
                  "hmc": "HMC with all chains in one tensor computation, ChEES-tuned trajectory length",
                  "laplace": "linearised Laplace at the MAP (subnetwork family), prior tuned by the evidence"},
    "subnetwork selections": {name: doc.splitlines()[0] for name, doc in SELECTIONS.items()},
}
assert set(TABLES["elbos"]) == set(ELBOS) and set(TABLES["inference"]) == set(INFERENCE)


def check_choice(field: str, value: str, table: dict) -> None:
    """Refuse a name that is not in ``table``, listing the names that are."""
    if value not in table:
        allowed = f"use one of: {', '.join(sorted(table))}"
        raise ZooInputError(field, value, allowed, message=f"unknown {field} {value!r}; {allowed}")


def check_guide_fits(family: str, guide: str) -> None:
    """Refuse a guide that does not fit the family's latent structure."""
    allowed = FAMILY_GUIDES[family]
    if guide not in allowed:
        raise ZooInputError("guide.name", guide, f"family '{family}' takes the guides: {', '.join(allowed)}")
