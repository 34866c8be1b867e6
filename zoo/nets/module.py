"""Your own ``nn.Module``, given in Python (``zoo.BNN(my_net, ...)``): the net a run was fitted on, kept with the run
as ``net.pt`` so that ``zoo.load`` rebuilds it."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr
from torch import nn

from zoo.errors import ZooInputError
from zoo.nets.base import NetSection
from zoo.parts import import_path

NET_FILE = "net.pt"  # where a run keeps a net given in Python (the whole module, pickled by torch.save)


class ModuleNetSpec(NetSection):
    """A net given in Python as an nn.Module (zoo.BNN(net, ...)); a run keeps it as net.pt."""

    optional: ClassVar[bool] = True  # never suggested in another net's place
    offered: ClassVar[bool] = False  # the zoo writes it (a run's spec.yaml); a spec names a net otherwise
    flat_rows: ClassVar[bool] = False  # it reads whatever rows the user's data have
    convolutional: ClassVar[bool | None] = None  # the module itself tells (checked when a run is built)

    name: Literal["module"] = Field(description="module")
    target: str | None = Field(None, description=(
        "the module's class as module.path:QualName: what must be importable to load the run again"))
    _module: nn.Module | None = PrivateAttr(None)

    @classmethod
    def of(cls, module: nn.Module) -> ModuleNetSpec:
        """The section of a module given in Python.

        :param module: the user's net.
        :returns: the section, holding the module.
        :raises ZooInputError: something that is not an ``nn.Module``.
        """
        if not isinstance(module, nn.Module):
            raise ZooInputError("net", type(module).__name__, "give a torch.nn.Module (or a net's name, e.g. 'mlp', "
                                "or a spec's net section)")
        check_module(module)
        section = cls(name="module", target=import_path(type(module)))
        section._module = module
        return section

    def holding(self, module: nn.Module) -> ModuleNetSpec:
        """This section with ``module`` attached (a run's ``net.pt``, read back).

        :param module: the net.
        :returns: the section itself.
        """
        self._module = module
        return self

    @property
    def module(self) -> nn.Module | None:
        """The module it holds (None where a run's spec was read without its ``net.pt``)."""
        return self._module

    def build(self, in_dim: int, out_dim: int) -> nn.Module:
        if self._module is None:
            raise ZooInputError("net", self.target, f"this run's net was given in Python: load the run with "
                                f"zoo.load(run_dir), which reads it from {NET_FILE}")
        return self._module


class _Sink:
    """A file that keeps nothing: what a trial ``torch.save`` writes to (it never holds the net twice in memory)."""

    def write(self, data: Any) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def check_module(module: nn.Module) -> None:
    """Refuse, before anything is fitted or written, a net the zoo cannot make Bayesian or keep with its run: a
    TorchScript module, complex parameters, and a module ``torch.save`` cannot pickle (a parametrization such as
    ``weight_norm``, a hook or attribute that is a lambda or a local function), which :data:`NET_FILE` needs.

    :param module: the user's net.
    :raises ZooInputError: naming the net, the cause and the fix.
    """
    name = type(module).__name__
    if isinstance(module, torch.jit.ScriptModule):
        raise ZooInputError("net", name, "it is a TorchScript module (torch.jit.script / torch.jit.trace), whose "
                            "weights cannot be swapped for posterior draws: give the nn.Module before scripting it")
    complex_ = [n for n, p in module.named_parameters() if p.is_complex()]
    if complex_:
        raise ZooInputError("net", name, f"its parameter {complex_[0]} is {module.get_parameter(complex_[0]).dtype}; "
                            "the priors and guides are real distributions (a float32 run would drop the imaginary "
                            "parts): give the real and imaginary parts as two real parameters")
    try:
        torch.save(module, _Sink())
    except Exception as err:  # noqa: BLE001 - pickling runs the user's code: any failure is named
        detail = str(err).splitlines()[0].split(" See:")[0][:200]
        if "parametrized" in detail:
            fix = ("remove the parametrization first (torch.nn.utils.parametrize.remove_parametrizations(layer, "
                   "'weight')), or use the hook-based torch.nn.utils.weight_norm / spectral_norm")
        else:
            fix = ("define hooks, functions and classes the net holds at the top level of a module (not lambdas or "
                   "local functions), so that torch.save can pickle it")
        raise ZooInputError("net", name, f"the zoo keeps your net with its run ({NET_FILE}, so that zoo.load "
                            f"rebuilds it), and torch.save cannot pickle it ({type(err).__name__}: {detail}): "
                            f"{fix}") from None
