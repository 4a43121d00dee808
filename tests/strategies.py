"""Hypothesis strategies derived from msgspec types, for codec round-trip properties."""

from __future__ import annotations

from typing import Any

import msgspec.inspect as mi
from hypothesis import strategies as st

_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def for_type(tp: Any) -> st.SearchStrategy[Any]:
    """A strategy for any value msgspec can encode as ``tp`` (Structs included)."""
    return _for_info(mi.type_info(tp))


def _for_info(info: mi.Type) -> st.SearchStrategy[Any]:
    if isinstance(info, mi.AnyType):
        return st.one_of(st.none(), st.booleans(), _INT64, st.text(max_size=8))
    if isinstance(info, mi.NoneType):
        return st.none()
    if isinstance(info, mi.BoolType):
        return st.booleans()
    if isinstance(info, mi.IntType):
        lo = info.ge if info.ge is not None else -(2**63)
        hi = info.le if info.le is not None else 2**63 - 1
        return st.integers(min_value=lo, max_value=hi)
    if isinstance(info, mi.FloatType):
        return st.floats(allow_nan=False)
    if isinstance(info, mi.StrType):
        return st.text(max_size=20)
    if isinstance(info, (mi.BytesType, mi.ByteArrayType)):
        return st.binary(max_size=40)
    if isinstance(info, mi.ListType):
        return st.lists(_for_info(info.item_type), max_size=4)
    if isinstance(info, mi.VarTupleType):
        return st.lists(_for_info(info.item_type), max_size=4).map(tuple)
    if isinstance(info, mi.TupleType):
        return st.tuples(*(_for_info(t) for t in info.item_types))
    if isinstance(info, mi.DictType):
        return st.dictionaries(_for_info(info.key_type), _for_info(info.value_type), max_size=4)
    if isinstance(info, mi.UnionType):
        return st.one_of(*(_for_info(t) for t in info.types))
    if isinstance(info, mi.LiteralType):
        return st.sampled_from(list(info.values))
    if isinstance(info, mi.EnumType):
        return st.sampled_from(list(info.cls))
    if isinstance(info, mi.StructType):
        fields = {f.name: _for_info(f.type) for f in info.fields}
        return st.fixed_dictionaries(fields).map(lambda kw: info.cls(**kw))
    raise NotImplementedError(f"no strategy for {info!r}; extend tests/strategies.py")
