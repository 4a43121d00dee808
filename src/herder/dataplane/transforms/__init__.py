"""Connect's single message transforms and predicates, as Spark column expressions.

A connector config names its transforms as Connect's does (``transforms=a,b``,
``transforms.a.type=org.apache.kafka.connect.transforms.InsertField$Value`` or just
``InsertField$Value``, ``predicates=p``, ``transforms.a.predicate=p``,
``transforms.a.negate=true``); a source's records go through the chain between poll
and write, a sink's between read and put, inside the Spark plan that moves them.

* :mod:`.base` — what a transform or predicate is;
* :mod:`.converters` — a record's bytes as the variants transforms see;
* :mod:`.fields`, :mod:`.cast`, :mod:`.routing` — the transforms; :mod:`.predicates`;
* :mod:`.chain` — the config syntax and the chain over a DataFrame;
* :mod:`.pipeline` — the chain and the ``errors.*`` handling around a task's batches.

:func:`plugins` lists them all, as ``GET /connector-plugins?connectorsOnly=false`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from herder.config import ConfigDef
from herder.dataplane.transforms.base import Outcome, Predicate, Record, Transformation
from herder.dataplane.transforms.chain import (
    BUILT_IN_PREDICATES,
    BUILT_IN_TRANSFORMS,
    TransformChain,
    predicate_class,
    transform_class,
    validate_transforms,
)

__all__ = [
    "PREDICATE",
    "TRANSFORMATION",
    "Outcome",
    "PluginDescriptor",
    "Predicate",
    "Record",
    "TransformChain",
    "Transformation",
    "plugins",
    "predicate_class",
    "transform_class",
    "validate_transforms",
]

TRANSFORMATION: Final = "transformation"
PREDICATE: Final = "predicate"


@dataclass(frozen=True)
class PluginDescriptor:
    """One transform or predicate, as the REST API lists it."""

    class_name: str
    type: str
    version: str
    config_def: ConfigDef

    def to_json(self) -> dict[str, str]:
        """Connect's ``PluginInfo`` body: ``class``, ``type`` and ``version``."""
        return {"class": self.class_name, "type": self.type, "version": self.version}


def plugins() -> list[PluginDescriptor]:
    """Every built-in transform and predicate, sorted by class name within each type."""
    found = [
        PluginDescriptor(k.class_name, TRANSFORMATION, k.version(), k.config_def())
        for k in BUILT_IN_TRANSFORMS
    ]
    found += [
        PluginDescriptor(k.class_name, PREDICATE, k.version(), k.config_def())
        for k in BUILT_IN_PREDICATES
    ]
    return sorted(found, key=lambda p: (p.type != TRANSFORMATION, p.class_name))
