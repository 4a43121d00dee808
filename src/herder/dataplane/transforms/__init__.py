"""Connect's single message transforms and predicates, as Spark column expressions.

A connector config names its transforms as Connect's does (``transforms=a,b``,
``transforms.a.type=org.apache.kafka.connect.transforms.InsertField$Value`` or just
``InsertField$Value``, ``predicates=p``, ``transforms.a.predicate=p``,
``transforms.a.negate=true``); a source's records go through the chain between poll
and write, a sink's between read and put, inside the Spark plan that moves them.

What a transform or predicate is, and how workers find them, is the connector API's
(:mod:`herder.connect.transforms`); herder's own are installed like anyone's, under the
``herder.transforms`` and ``herder.predicates`` entry points of its package.

* :mod:`.builtin` — what herder's own share;
* :mod:`.converters` — a record's bytes as the variants transforms see;
* :mod:`.fields`, :mod:`.cast`, :mod:`.routing` — the transforms; :mod:`.predicates`;
* :mod:`.chain` — the config syntax and the chain over a DataFrame;
* :mod:`.pipeline` — the chain and the ``errors.*`` handling around a task's batches.
"""

from herder.dataplane.transforms.chain import TransformChain, validate_transforms

__all__ = ["TransformChain", "validate_transforms"]
