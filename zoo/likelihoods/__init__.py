"""Likelihoods: each is one module holding its observation model and its ``likelihood`` section, registered here
once.

:data:`LIKELIHOODS` is the registry. The spec's ``likelihood`` section names one, or ``auto`` (the default): the
likelihood the data's task picks (:attr:`zoo.tasks.Task.likelihood`), with whichever settings of it are given.
Adding a likelihood is its module (a :class:`~zoo.likelihoods.base.Likelihood` and a
:class:`~zoo.likelihoods.base.LikelihoodSection`) and one entry below.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, create_model

from zoo.errors import ZooInputError
from zoo.likelihoods.base import (
    Likelihood,
    LikelihoodSection,
    MemberAverage,
    PredictiveDraws,
    draw_latents,
    observation,
    observe,
    observe_rows,
    uniform_member_mixture,
)
from zoo.likelihoods.categorical import Categorical, CategoricalSpec, LogitsCategorical, categorical_hessian_root
from zoo.likelihoods.gaussian import Gaussian, GaussianSpec, HeteroscedasticGaussian, NoisePrior
from zoo.parts import Catalogue, Strict

__all__ = ["LIKELIHOODS", "AutoLikelihoodSpec", "Categorical", "CategoricalSpec", "Gaussian", "GaussianSpec",
           "HeteroscedasticGaussian", "Likelihood", "LikelihoodConfig", "LikelihoodSection", "LogitsCategorical",
           "MemberAverage", "NoisePrior", "PredictiveDraws", "categorical_hessian_root", "draw_latents",
           "observation", "observe", "observe_rows", "uniform_member_mixture"]

LIKELIHOODS = Catalogue("likelihood", CategoricalSpec, GaussianSpec)


def _settings_of_every_likelihood() -> dict[str, Any]:
    """Every registered likelihood's settings (its fields but ``name``), for the ``auto`` section."""
    fields: dict[str, Any] = {}
    for section in LIKELIHOODS.sections.values():
        for key, info in section.model_fields.items():
            if key != "name" and key not in fields:
                fields[key] = (info.annotation, info)
    return fields


class _AutoBase(Strict):
    def _as(self, likelihood: str) -> LikelihoodSection:
        section = LIKELIHOODS[likelihood]
        return section.model_validate({"name": likelihood, **{k: v for k, v in self.model_dump().items()
                                                              if k in section.model_fields and k != "name"}})

    @property
    def noise_from_net(self) -> bool:
        """Whether the net predicts the noise, for whichever likelihood the task picks."""
        return any(self._as(name).noise_from_net for name in LIKELIHOODS)

    def resolve(self, likelihood: str) -> LikelihoodSection:
        """The section of the likelihood the data's task picks, with the settings given for it.

        :param likelihood: the registered likelihood the task picks.
        :returns: that likelihood's section.
        :raises ZooInputError: a setting given for another likelihood.
        """
        section = LIKELIHOODS[likelihood]
        given = self.model_dump(exclude_unset=True, exclude={"name"})
        defaults, full = type(self)().model_dump(), self.model_dump()
        for key in [k for k in given if k not in section.model_fields and full[k] == defaults[k]]:
            del given[key]  # another likelihood's setting at its default: a run directory records every field
            # (as of its day: a nested setting added since, absent from it, is at its default too)
        stray = sorted(key for key in given if key not in section.model_fields)
        if stray:
            owners = [name for name, s in LIKELIHOODS.items() if stray[0] in s.model_fields]
            raise ZooInputError(f"likelihood.{stray[0]}", given[stray[0]], f"it is a setting of {', '.join(owners)}, "
                                f"and this data set's task picks the {likelihood} likelihood: drop it")
        return section.model_validate({"name": likelihood, **given})


AutoLikelihoodSpec = create_model(
    "AutoLikelihoodSpec", __base__=_AutoBase, __doc__=(
        "The likelihood the data's task picks (categorical for classes, gaussian for regression), with any of its "
        "settings."),
    name=(Literal["auto"], Field("auto", description="auto: the likelihood the data's task picks (categorical for "
                                 "classes, gaussian for regression)")),
    **_settings_of_every_likelihood())

LikelihoodConfig = Annotated[Union[(AutoLikelihoodSpec, *LIKELIHOODS.sections.values())],  # noqa: UP007
                             Field(discriminator="name")]
