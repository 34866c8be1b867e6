"""Guides: each is one module holding its guide class and its ``guide`` section, registered here once.

:data:`GUIDES` is the registry: the spec's ``guide`` section takes any registered guide (``guide.name``), ``zoo
list`` lists them, and a guide fits a family when the family offers every kind of latent structure the guide
``needs`` (and, for a family of point estimates only, when the guide is a point estimate). Adding a guide is its
module (a :class:`~guides.base.Guide` and a :class:`~guides.base.GuideSection`) and one entry below.
"""

from __future__ import annotations

from guides.auto import AutoGuideSpec
from guides.delta import DeltaGuideSpec
from guides.dropout import DropoutGuideSpec
from guides.full_rank import FullRankGuideSpec
from guides.laplace import LaplaceGuideSpec
from guides.mean_field import MeanFieldGuideSpec
from guides.mixture import BatchEnsembleGuideSpec, MixtureGuideSpec
from zoo.parts import Catalogue

GUIDES = Catalogue("guide", MeanFieldGuideSpec, DeltaGuideSpec, MixtureGuideSpec, BatchEnsembleGuideSpec,
                   DropoutGuideSpec, FullRankGuideSpec, LaplaceGuideSpec, AutoGuideSpec)
GuideConfig = GUIDES.union()
