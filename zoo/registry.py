"""Every swappable part, by name: the catalogues of priors, guides, families and inference methods (each registered
once, in its own package), the tables ``zoo list`` prints, and the rules that say which parts combine, read from
what the parts declare."""

from __future__ import annotations

from guides import GUIDES
from guides.auto import KINDS as AUTOGUIDES
from guides.base import GuideSection
from zoo.data import DATASETS
from zoo.errors import ZooInputError
from zoo.inference import METHODS
from zoo.inference.base import InferenceMethod
from zoo.inference.elbo import ELBOS
from zoo.likelihoods import LIKELIHOODS
from zoo.members import MEMBERS
from zoo.models import FAMILIES
from zoo.models.base import FamilySection
from zoo.models.subnetwork import SELECTIONS
from zoo.nets import ACTIVATIONS, NETS
from zoo.parts import first_sentence
from zoo.priors import PRIORS

__all__ = ["FAMILIES", "GUIDES", "METHODS", "PRIORS", "SHARED_WORK", "TABLES", "check_choice", "check_guide_fits",
           "fitting_guides", "guide_misfit", "method_of", "summary_of"]

# What the processes of ``zoo train --nproc N`` share, for every method that splits its work (zoo.distributed)
SHARED_WORK = {name: what for method in METHODS.methods() for name, what in method.shared_work.items()}

summary_of = first_sentence  # what ``zoo list`` shows of a part

TABLES = {
    "data sets": DATASETS,
    "nets": NETS.summaries(),
    "activations": {name: cls.__name__ for name, cls in ACTIVATIONS.items()},
    "priors": PRIORS.summaries(),
    "families": FAMILIES.summaries(),
    "guides": GUIDES.summaries(),
    "autoguides (guide.auto)": {name: about for name, (_, about) in AUTOGUIDES.items()},
    "likelihoods": {"auto": "the likelihood the data's task picks", **LIKELIHOODS.summaries()},
    "elbos": {"trace_mean_field": "analytic KL where registered, Monte Carlo elsewhere (default)",
              "trace": "Monte Carlo KL everywhere"},
    "inference": METHODS.summaries(),
    "subnetwork selections": {name: summary_of(doc) for name, doc in SELECTIONS.items()},
    "members (member: NAME)": {name: member.about for name, member in MEMBERS.items()},
}
assert set(TABLES["elbos"]) == set(ELBOS)


def check_choice(field: str, value: str, table: dict) -> None:
    """Refuse a name that is not in ``table``, listing the names that are.

    :param field: the spec field, for the message.
    :param value: the name given.
    :param table: the registered names.
    :raises ZooInputError: an unregistered name.
    """
    if value not in table:
        allowed = f"use one of: {', '.join(sorted(table))}"
        raise ZooInputError(field, value, allowed, message=f"unknown {field} {value!r}; {allowed}")


def method_of(spec) -> InferenceMethod:
    """The inference method of a run spec.

    :param spec: a :class:`~zoo.spec.RunSpec`.
    :returns: the registered method its ``inference.method`` names.
    """
    return METHODS.method(spec.inference.method)


def guide_misfit(guide: type[GuideSection] | GuideSection, family: type[FamilySection] | FamilySection) -> str | None:
    """Why a guide does not fit a family's latent structure, or None where it does: the family must offer every kind
    of latent site the guide needs, and a family of point estimates only takes point-estimate guides.

    :param guide: the guide's section (class or instance).
    :param family: the family's section (class or instance).
    :returns: the reason, or None.
    """
    missing = sorted(guide.needs - family.offers)
    if missing:
        return f"it needs {' and '.join(missing)}, and the family has {' and '.join(sorted(family.offers))}"
    if family.point_estimates_only and not guide.point_estimate:
        return "the family is fitted as point estimates only, and this guide is not one"
    return None


def fitting_guides(family: type[FamilySection] | FamilySection) -> list[str]:
    """The registered guides that fit a family.

    :param family: the family's section (class or instance).
    :returns: the guides' names, in registration order.
    """
    return [name for name, guide in GUIDES.items() if guide_misfit(guide, family) is None]


def check_guide_fits(guide: GuideSection, family: FamilySection) -> None:
    """Refuse a guide that does not fit the family's latent structure, naming the guides that do.

    :param guide: the spec's guide section.
    :param family: the spec's model section.
    :raises ZooInputError: a misfit.
    """
    why = guide_misfit(guide, family)
    if why is not None:
        raise ZooInputError("guide.name", guide.name, f"does not fit family '{family.family}': {why}; family "
                            f"'{family.family}' takes the guides: {', '.join(fitting_guides(family))}")
