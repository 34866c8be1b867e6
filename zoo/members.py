"""The zoo's members as named presets: each is a family, a guide, a prior and an inference method (the sections of a
run spec) under one name, so that ``member: rank1_cauchy`` in a spec, or ``zoo.BNN(net, member="rank1_cauchy")``,
is the whole member, and anything given beside it overrides its part.

A preset holds what makes the member what it is (the rank-1 Cauchy member's family, mixture guide and Cauchy
prior centred at 1), with the digits configs' values for the settings that are tuned per data set (the factors'
prior scale, the dropout rate, the subnetwork's selection); the data, the net, run lengths and learning rates stay
the user's. This is the zoo's one table of members: every shipped config names its member (``member:
rank1_cauchy`` in ``configs/rank1_cauchy_digits.yaml``) and sets only what is its own, a config for other data
overriding the tuned values it chose otherwise, and ``benchmarks/fidelity.py`` builds its members from these
presets. A member's digits config (``configs/<member>_digits.yaml``; Bayes by Backprop's is
``mean_field_digits.yaml``) overrides none of its preset's values. Adding a member is one entry in
:data:`MEMBERS`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from zoo.errors import ZooInputError


@dataclass(frozen=True)
class Member:
    """A named preset of the spec's sections.

    :param about: one line for ``zoo list members`` and the docs.
    :param sections: the spec's sections that make the member (``model``, ``guide``, ``prior``, ``inference``).
    """

    about: str
    sections: dict[str, Any] = field(default_factory=dict)


RANK1 = {"family": "rank1", "members": 4}
# rank-1 factors: centred at 1. Scale 1, not the 0.1 of the digits configs' runs of 100+ epochs: at 0.1 the factors
# stayed pinned near 1 and the members' predictive was underconfident on the user nets of benchmarks/defaults.py
# (digits NLL 0.243 against 0.085 at scale 1; the plain net's 0.092), see docs/results/defaults.md
PRIOR_AT_ONE = {"name": "normal", "loc": 1.0, "scale": 1.0}
SWAG = {"method": "swag", "momentum": 0.9}  # rank: the default 20, lowered to the iterates of a short budget


def _posthoc_laplace(strategy: str, covariance: str = "full") -> dict[str, Any]:
    """A Laplace member over a selection of whole layers: per-layer precisions by the evidence, the Laplace bridge
    (or, where the fit has validation rows, the link likeliest there: ``inference.link_by`` unset)."""
    return {"model": {"family": "subnetwork", "selection": {"strategy": strategy}},
            "guide": {"name": "laplace", "covariance": covariance},
            "inference": {"method": "laplace", "prior_structure": "layer", "link": "bridge"}}


MEMBERS: dict[str, Member] = {
    "map": Member("MAP: one point estimate of every weight under the prior (weight decay)",
                  {"model": {"family": "all_weights"}, "guide": {"name": "delta"}}),
    "mean_field": Member("Bayes by Backprop: a factorised Gaussian per weight, sigma = softplus(rho)",
                         {"model": {"family": "all_weights"}, "guide": {"name": "mean_field"}}),
    "bayes_by_backprop": Member("Bayes by Backprop with its scale-mixture prior (pi 0.5, sigma1 1, sigma2 0.0025) "
                                "and local reparameterisation (Blundell et al. 2015)",
                                {"model": {"family": "all_weights"}, "guide": {"name": "mean_field"},
                                 "prior": {"name": "scale_mixture", "pi": 0.5, "sigma1": 1.0, "sigma2": 0.0025},
                                 "inference": {"method": "svi", "local_reparam": True}}),
    "mc_dropout": Member("MC dropout: Bernoulli masks on every weight matrix's inputs but the first, the rate p "
                         "chosen on the validation rows where a fit has them (Gal & Ghahramani 2016)",
                         {"model": {"family": "all_weights"}, "guide": {"name": "dropout"}}),
    "concrete_dropout": Member("concrete dropout: a dropout rate learned per layer, from the p chosen on the "
                               "validation rows where a fit has them (Gal, Hron & Kendall 2017)",
                               {"model": {"family": "all_weights"},
                                "guide": {"name": "dropout", "dropout": "concrete"}}),
    "deep_ensemble": Member("deep ensemble: K = 5 independently initialised MAP nets (Lakshminarayanan et al. 2017)",
                            {"model": {"family": "deep_ensemble", "members": 5}, "guide": {"name": "delta"}}),
    "rank1_normal": Member("rank-1 BNN: shared W, K = 4 members' rank-1 factors with Normal(1, 1) priors, a mixture "
                           "guide (Dusenberry et al. 2020)",
                           {"model": RANK1, "guide": {"name": "mixture"}, "prior": PRIOR_AT_ONE}),
    "rank1_cauchy": Member("rank-1 BNN with Cauchy(1, 0.1) priors on the factors of K = 4 members (Dusenberry et al. "
                           "2020)",
                           {"model": RANK1, "guide": {"name": "mixture"},
                            "prior": {"name": "cauchy", "loc": 1.0, "scale": 0.1}}),
    "rank1_gsm": Member("rank-1 BNN, K = 4, with a hierarchical Gaussian scale mixture on the factors (1 + tau z, "
                        "half-Cauchy tau of scale 0.3 per neuron), non-centred; a mixture of Normal components",
                        # Normal, not Cauchy, components: with Cauchy ones the members underfit the user nets of
                        # benchmarks/defaults.py (uci RMSE 15.6 against 5.05; digits NLL 0.225 against 0.125)
                        {"model": RANK1, "guide": {"name": "mixture", "component": "normal"},
                         "prior": {"name": "gsm", "loc": 1.0, "scale_prior": "half_cauchy", "scale": 0.3}}),
    "batch_ensemble": Member("BatchEnsemble: the rank-1 BNN's Dirac special case, K = 4 (Wen et al. 2020)",
                             {"model": RANK1, "guide": {"name": "batch_ensemble"},
                              "prior": {"name": "normal", "loc": 1.0, "scale": 1.0}}),
    "subnetwork_laplace": Member("subnetwork linearised Laplace: a full-covariance Gaussian over the 10% of a MAP "
                                 "net's weights with the largest variance, one prior precision per layer tuned by "
                                 "the evidence (Daxberger et al. 2021)",
                                 {"model": {"family": "subnetwork", "selection": {"strategy": "largest_variance",
                                                                                  "size": 0.1}},
                                  "inference": {"method": "laplace", "prior_structure": "layer"}}),
    "last_layer_laplace": Member("last-layer linearised Laplace: a Gaussian over the output layer of a MAP net, "
                                 "full-covariance over a narrow head and Kronecker-factored over a wide one "
                                 "(guide.covariance auto), one prior precision per layer tuned by the evidence, "
                                 "predictions by the Laplace bridge or the link likeliest on validation rows "
                                 "(Kristiadi et al. 2020; laplace-torch's default subset)",
                                 _posthoc_laplace("last_layer", "auto")),
    "diagonal_laplace": Member("diagonal linearised Laplace over every weight of a MAP net (normalisation layers at "
                               "the MAP), one prior precision per layer tuned by the evidence at the MAP, predictions "
                               "by the Laplace bridge or the link likeliest on validation rows",
                               _posthoc_laplace("all", "diag")),
    "kfac_laplace": Member("Kronecker-factored (KFAC) linearised Laplace over every weight of a MAP net "
                           "(normalisation layers at the MAP), one prior precision per layer tuned by the evidence at "
                           "the MAP, predictions by the Laplace bridge or the link likeliest on validation rows "
                           "(Ritter et al. 2018; Immer et al. 2021)",
                           _posthoc_laplace("all", "kron")),
    "swag": Member("SWAG: a diagonal + rank-20 Gaussian from SGD iterates, momentum 0.9 (Maddox et al. 2019)",
                   {"inference": {**SWAG, "num_models": 1}}),
    "multiswag": Member("MultiSWAG: 5 SWAG Gaussians from independent SGD runs (Wilson & Izmailov 2020)",
                        {"inference": {**SWAG, "num_models": 5}}),
    "sgld": Member("stochastic-gradient Langevin dynamics, 4 chains, polynomial step decay (Welling & Teh 2011)",
                   {"inference": {"method": "sgld", "num_chains": 4, "schedule": "polynomial"}}),
    "cyclical_sghmc": Member("cyclical SGHMC: 4 chains, 4 restarts of a cosine step size, draws kept at the ends of "
                             "cycles (Zhang et al. 2020)",
                             {"inference": {"method": "sghmc", "num_chains": 4, "schedule": "cyclical",
                                            "cycles": 4, "exploration": 0.5, "momentum": 0.9}}),
    "hmc": Member("the zoo's many-chain HMC (16 chains in one batched computation), ChEES-tuned trajectories: the "
                  "gold standard for small nets",
                  {"inference": {"method": "hmc", "num_chains": 16}}),
    "nuts": Member("Pyro's NUTS, 4 chains, chain after chain", {"inference": {"method": "nuts", "num_chains": 4}}),
    "auto_normal": Member("Pyro's AutoNormal over every latent", {"guide": {"name": "auto", "auto": "normal"}}),
    "auto_low_rank_mvn": Member("Pyro's AutoLowRankMultivariateNormal over every latent, rank 10",
                                {"guide": {"name": "auto", "auto": "low_rank_mvn", "rank": 10}}),
    "auto_mvn": Member("Pyro's AutoMultivariateNormal over every latent", {"guide": {"name": "auto", "auto": "mvn"}}),
    "auto_laplace_approximation": Member("Pyro's AutoLaplaceApproximation: the MAP point polished by L-BFGS, the "
                                         "inverse Hessian there as covariance",
                                         {"guide": {"name": "auto", "auto": "laplace_approximation"}}),
}


KINDS = ("name", "family", "method")  # the keys that name a part: another part has other settings


def _merge(base: dict, over: Mapping) -> dict:
    """``over`` on top of ``base``, key by key at every depth; a mapping that names another part than the one under
    it (another ``name``, ``family`` or ``method``) replaces it whole, as its settings are another part's."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        mine = out.get(key)
        if isinstance(value, Mapping) and isinstance(mine, dict) and not any(
                k in value and k in mine and value[k] != mine[k] for k in KINDS):
            out[key] = _merge(mine, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def with_member(tree: dict, normal_forms: Mapping[str, Any] | None = None) -> dict:
    """A spec tree with its ``member`` preset underneath: the preset's sections, overridden key by key by the
    spec's own (a section that names another part, e.g. ``guide: {name: delta}`` or a prior's ``default: {name:
    normal}``, replaces the preset's whole, at any depth).

    :param tree: the spec as written, with or without ``member``.
    :param normal_forms: a section's normal form where it can be written two ways (the prior's flat and nested
        forms), applied to both sides before they merge.
    :returns: the tree, the preset merged in (``member`` kept, so the run records which member it is).
    :raises ZooInputError: a member name that is not registered.
    """
    name = tree.get("member")
    if name is None:
        return tree
    if name not in MEMBERS:
        allowed = f"use one of: {', '.join(MEMBERS)}"
        raise ZooInputError("member", name, allowed, message=f"unknown member {name!r}; {allowed}")
    normal = dict(normal_forms or {})
    tree = {k: normal[k](v) if k in normal else v for k, v in tree.items()}
    out = {k: normal[k](v) if k in normal else v for k, v in copy.deepcopy(MEMBERS[name].sections).items()}
    return _merge(out, tree)
