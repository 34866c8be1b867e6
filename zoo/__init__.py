"""pyro-bnn-zoo: Bayesian neural networks in Pyro whose pieces you can swap and whose posteriors you can check.

``zoo.BNN`` makes your ``nn.Module`` a Bayesian neural network and fits it (:mod:`zoo.bnn`); ``zoo.load`` reads a fit
back from its run directory. They are imported on first use, so that ``import zoo`` stays light.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["BNN", "Prediction", "__version__", "load"]

try:
    __version__ = version("pyro-bnn-zoo")  # the installed distribution's (pyproject.toml's) version
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str) -> Any:
    if name in __all__:
        from zoo import bnn

        return getattr(bnn, name)
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")
