"""Inference methods: each is one module holding its spec section, its fitter and its
:class:`~zoo.inference.base.InferenceMethod`, registered here once.

:data:`METHODS` is the registry: the run spec's ``inference`` field is its union (discriminated by ``method``),
``zoo list inference``, the CLI's help and the spec reference read it. Adding a method is its module (a spec
section with a ``method: Literal[...]`` field, a fitter taking a :class:`~zoo.inference.base.FitContext`, and an
:class:`~zoo.inference.base.InferenceMethod` naming both) and one entry below.
"""

from __future__ import annotations

from zoo.inference.base import FitContext, InferenceMethod, MethodCatalogue
from zoo.inference.laplace import Laplace
from zoo.inference.mcmc import MCMC
from zoo.inference.sgmcmc import SGMCMC
from zoo.inference.svi import SVI
from zoo.inference.swag import SWAG

__all__ = ["METHODS", "FitContext", "InferenceMethod", "MethodCatalogue"]

METHODS = MethodCatalogue(SVI(), MCMC(), Laplace(), SGMCMC(), SWAG())
