"""pyro-bnn-zoo: Bayesian neural networks in Pyro whose pieces you can swap and whose posteriors you can check.

``zoo.BNN`` makes your ``nn.Module`` a Bayesian neural network and fits it (:mod:`zoo.bnn`); ``zoo.load`` reads a fit
back from its run directory. ``zoo.reference`` samples the exact posterior of your net until it converges, and
``zoo.compare`` says how far each fit is from it (:mod:`zoo.diagnostics`). They are imported on first use, so that
``import zoo`` stays light.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["BNN", "Comparison", "Prediction", "__version__", "compare", "load", "reference"]
_HOMES = {"BNN": "zoo.bnn", "Prediction": "zoo.bnn", "load": "zoo.bnn", "compare": "zoo.diagnostics",
          "Comparison": "zoo.diagnostics", "reference": "zoo.diagnostics"}

try:
    __version__ = version("pyro-bnn-zoo")  # the installed distribution's (pyproject.toml's) version
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        from importlib import import_module

        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")
