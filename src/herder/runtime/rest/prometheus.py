"""``GET /metrics``: a worker's metrics in Prometheus's text format.

Connect publishes its metrics on JMX as ``kafka.connect:type=<group>,connector=…,task=…``
attributes with kebab-case names, and Prometheus users read them through the JMX
exporter. herder serves the same metrics directly, named by the rule most exporter
configurations for Connect use (Strimzi's among them), so dashboards built on those
carry over:

    ``kafka_connect_`` + the group without ``connect-`` in front or ``-metrics`` at the
    end + ``_`` + the metric's name, every character outside ``[a-zA-Z0-9_]`` turned
    into ``_``; the ``connector`` and ``task`` of the MBean become labels.

So ``source-task-metrics`` / ``source-record-poll-total`` is
``kafka_connect_source_task_source_record_poll_total{connector="in",task="0"}``,
``connect-worker-metrics`` / ``connector-count`` is ``kafka_connect_worker_connector_count``
and ``connect-worker-rebalance-metrics`` / ``rebalance-avg-time-ms`` is
``kafka_connect_worker_rebalance_rebalance_avg_time_ms``. A metric whose name ends in
``-total`` is a counter, every other a gauge. A metric whose value is text (a status, a
leader's URL, a class name) is a gauge of 1 with the text in a label named like the
metric: ``kafka_connect_connector_task_status{connector="in",task="0",status="running"} 1``.
A metric with nothing to say yet (an average before the first batch) is left out.

herder's own metrics, beside Connect's, are named ``herder_`` + the name by the same
rule: ``herder_topic_end_offset{topic,partition}``, ``herder_sink_task_lag_records`` and
``herder_sink_task_lag_seconds`` (per sink task), ``herder_task_spark_jobs_total`` and
``herder_task_spark_job_seconds_total`` (the Spark jobs each task ran, counted by its job
group, and the time its submissions took). The process's own ``process_*`` metrics come with them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from herder.runtime.shell.herder import DistributedHerder
from herder.runtime.task_metrics import HERDER, Sample

__all__ = ["metrics_routes", "prometheus_name", "render"]

REBALANCE = "connect-worker-rebalance-metrics"
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_name(group: str, name: str) -> str:
    """The Prometheus name of Connect's metric ``name`` of ``group`` (see the module)."""
    if group == HERDER:
        return _INVALID.sub("_", f"herder_{name}")
    short = group.removeprefix("connect-").removesuffix("-metrics")
    return _INVALID.sub("_", f"kafka_connect_{short}_{name}")


def _label(name: str) -> str:
    return _INVALID.sub("_", name)


def families(samples: Iterable[Sample]) -> list[Metric]:
    """``samples`` as Prometheus metric families, one per name, in order of appearance."""
    out: dict[str, Metric] = {}
    for sample in samples:
        name = prometheus_name(sample.group, sample.name)
        labels = dict(sample.labels)
        value: float
        if isinstance(sample.value, str):
            labels[_label(sample.name)] = sample.value
            value = 1.0
        else:
            value = float(sample.value)
        family = out.get(name)
        if family is None:
            documentation = f"{sample.group} {sample.name}"
            if name.endswith("_total") and not isinstance(sample.value, str):
                family = CounterMetricFamily(name, documentation, labels=list(labels))
            else:
                family = GaugeMetricFamily(name, documentation, labels=list(labels))
            out[name] = family
        family.add_sample(
            family.name + ("_total" if isinstance(family, CounterMetricFamily) else ""),
            labels,
            value,
        )
    return list(out.values())


class _Once(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._metrics


def render(samples: Iterable[Sample], *, process: bool = True) -> bytes:
    """Prometheus's text format of ``samples`` (and of this process, with ``process``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once(families(samples)))
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
    return generate_latest(registry)


def rebalance_samples(herder: DistributedHerder) -> Iterator[Sample]:
    """``connect-worker-rebalance-metrics``, Connect's names."""
    yield Sample(REBALANCE, "connect-protocol", herder.config.connect_protocol)
    for name, value in herder.rebalance_metrics_now().items():
        if value is not None:
            yield Sample(REBALANCE, name, value)


def task_counts(herder: DistributedHerder) -> dict[str, dict[str, int]]:
    """Per connector running here, its tasks by state as the status log has them."""
    view = herder.statuses.view
    counts: dict[str, dict[str, int]] = {}
    for connector in herder.worker.connectors:
        by_state: dict[str, int] = {}
        for status in view.tasks(connector):
            state = status.state.value.lower()
            by_state[state] = by_state.get(state, 0) + 1
        counts[connector] = by_state
    return counts


async def worker_samples(herder: DistributedHerder) -> list[Sample]:
    """Every metric of the worker ``herder`` steers."""
    samples = list(herder.worker.metrics.samples(task_counts(herder)))
    samples += rebalance_samples(herder)
    more: Any = getattr(herder.worker.execution_factory, "metric_samples", None)
    if callable(more):
        samples += await more()
    return samples


def metrics_routes(herder: DistributedHerder) -> APIRouter:
    api = APIRouter(tags=["metrics"])

    @api.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """This worker's metrics in Prometheus's text format (Connect's names)."""
        return Response(render(await worker_samples(herder)), media_type=CONTENT_TYPE_LATEST)

    return api
