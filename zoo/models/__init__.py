"""Model families: each is one module holding its family class and its ``model`` section, registered here once.

:data:`FAMILIES` is the registry: the spec's ``model`` section takes any registered family (``model.family``),
``zoo list`` lists them. Adding a family is its module (a :class:`~zoo.models.base.ModelFamily` and a
:class:`~zoo.models.base.FamilySection` declaring what its latent structure offers) and one entry below.
"""

from __future__ import annotations

from zoo.models.all_weights import AllWeightsModelSpec
from zoo.models.deterministic import DeepEnsembleModelSpec
from zoo.models.rank1 import Rank1ModelSpec
from zoo.models.subnetwork import SubnetworkModelSpec
from zoo.parts import Catalogue

FAMILIES = Catalogue("family", AllWeightsModelSpec, Rank1ModelSpec, DeepEnsembleModelSpec, SubnetworkModelSpec,
                     key="family", field="model.family", renamed={"mean_field": "all_weights"})
ModelSpec = FAMILIES.union()
