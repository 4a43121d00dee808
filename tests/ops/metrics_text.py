"""Reading Prometheus's text format back, for the tests of ``/metrics``."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``text``: (name, labels) → value."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float | None:
    """The value of ``name`` with exactly ``labels``, or None."""
    return samples.get((name, frozenset(labels.items())))
