"""Name -> constructor tables for every swappable part; ``zoo list`` prints them and the spec checks names here."""

from __future__ import annotations

import re
from typing import get_args

from guides.auto import KINDS as AUTOGUIDES
from guides.auto import AutoGuide
from guides.delta import DeltaGuide
from guides.dropout import DropoutGuide
from guides.full_rank import FullRankGuide
from guides.laplace import LaplaceGuide
from guides.mean_field import MeanFieldNormalGuide
from guides.mixture import BatchEnsembleGuide, MixtureGuide
from zoo.data import DATASETS
from zoo.errors import ZooInputError
from zoo.inference.base import InferenceMethod
from zoo.inference.elbo import ELBOS
from zoo.inference.laplace import Laplace
from zoo.inference.mcmc import MCMC
from zoo.inference.sgmcmc import SGMCMC
from zoo.inference.svi import SVI
from zoo.inference.swag import SWAG
from zoo.likelihoods import LIKELIHOODS
from zoo.models.deterministic import DeepEnsemble
from zoo.models.mean_field import MeanFieldBNN
from zoo.models.rank1 import Rank1BNN
from zoo.models.subnetwork import SELECTIONS, SubnetworkBNN
from zoo.nets import ACTIVATIONS, NETS
from zoo.sections import PriorConfig

PRIORS = {get_args(cls.model_fields["name"].annotation)[0]: cls for cls in get_args(get_args(PriorConfig)[0])}
FAMILIES = {"mean_field": MeanFieldBNN, "rank1": Rank1BNN, "deep_ensemble": DeepEnsemble, "subnetwork": SubnetworkBNN}
GUIDES = {"mean_field": MeanFieldNormalGuide, "delta": DeltaGuide, "mixture": MixtureGuide,
          "batch_ensemble": BatchEnsembleGuide, "dropout": DropoutGuide, "full_rank": FullRankGuide,
          "laplace": LaplaceGuide, "auto": AutoGuide}
# Which guides fit which family's latent structure (a guide outside this list is refused up front): the mixture
# and BatchEnsemble guides need ensemble members; MC dropout masks plain weight matrices (mean-field sites); a deep
# ensemble is K MAP fits (Delta only); the subnetwork is one vector site, so a full-covariance Gaussian fits it
# (Laplace, or SVI with full_rank).
FAMILY_GUIDES = {"mean_field": ("mean_field", "delta", "dropout", "auto"),
                 "rank1": ("mixture", "batch_ensemble", "mean_field", "delta", "auto"),
                 "deep_ensemble": ("delta",),
                 "subnetwork": ("laplace", "full_rank", "mean_field", "delta", "auto")}
# Every inference method, registered once: its spec section joins the run spec and ``zoo list`` from here
METHODS: dict[str, InferenceMethod] = {name: method
                                       for method in (SVI(), MCMC(), Laplace(), SGMCMC(), SWAG())
                                       for name in method.names}
# What the processes of ``zoo train --nproc N`` share, for every method that splits its work (zoo.distributed)
SHARED_WORK = {name: what for method in dict.fromkeys(METHODS.values()) for name, what in method.shared_work.items()}

def summary_of(obj: object) -> str:
    """The first sentence of ``obj``'s docstring (or of ``obj``, a string), unwrapped: ``zoo list``'s description
    of a part, with double backquotes dropped; the whole first paragraph when it has no sentence end."""
    doc = obj if isinstance(obj, str) else obj.__doc__ or ""
    paragraph = " ".join(line.strip() for line in doc.strip().split("\n\n")[0].splitlines())
    sentence = re.split(r"(?<=[.!?])\s+(?=[A-Z(])", paragraph, maxsplit=1)[0]
    return sentence.replace("``", "")


TABLES = {
    "data sets": DATASETS,
    "nets": {name: summary_of(fn) for name, fn in NETS.items()},
    "activations": {name: cls.__name__ for name, cls in ACTIVATIONS.items()},
    "priors": {name: summary_of(cls) for name, cls in PRIORS.items()},
    "families": {name: summary_of(cls) for name, cls in FAMILIES.items()},
    "guides": {name: summary_of(cls) for name, cls in GUIDES.items()},
    "autoguides (guide.auto)": {name: about for name, (_, about) in AUTOGUIDES.items()},
    "likelihoods": {name: summary_of(cls) for name, cls in LIKELIHOODS.items()},
    "elbos": {"trace_mean_field": "analytic KL where registered, Monte Carlo elsewhere (default)",
              "trace": "Monte Carlo KL everywhere"},
    "inference": {" | ".join(method.names): method.summary for method in dict.fromkeys(METHODS.values())},
    "subnetwork selections": {name: summary_of(doc) for name, doc in SELECTIONS.items()},
}
assert set(TABLES["elbos"]) == set(ELBOS)


def check_choice(field: str, value: str, table: dict) -> None:
    """Refuse a name that is not in ``table``, listing the names that are."""
    if value not in table:
        allowed = f"use one of: {', '.join(sorted(table))}"
        raise ZooInputError(field, value, allowed, message=f"unknown {field} {value!r}; {allowed}")


def guide_label(spec) -> str:
    """The spec's guide by name, with the autoguide it names: ``mean_field``, ``auto:low_rank_mvn``."""
    return f"auto:{spec.guide.auto}" if spec.guide.name == "auto" else spec.guide.name


def method_of(spec) -> InferenceMethod:
    """The inference method of a run spec."""
    return METHODS[spec.inference.method]


def check_guide_fits(family: str, guide: str) -> None:
    """Refuse a guide that does not fit the family's latent structure."""
    allowed = FAMILY_GUIDES[family]
    if guide not in allowed:
        raise ZooInputError("guide.name", guide, f"family '{family}' takes the guides: {', '.join(allowed)}")
