"""The deployment of ``docs/deploy.md``, on hosts of their own: one network namespace and
one address per machine.

An ensemble server, a Spark Master, two Spark Workers of one core and two herder workers,
each in its own namespace on a private bridge (:mod:`tests.nemesis.hosts`); the storage
root is one directory every host sees (the same filesystem: a shared mount, declared
with ``storage.root.shared=true``). Each herder worker runs its Spark application on the
cluster with its driver on its own address; the test process reaches the REST APIs and
the ensemble at the hosts' addresses over the bridge. Both pipelines of the cluster tests
run (file → topic → directory with a backlog read on the executors, directory → topic →
file), each line delivered once. Needs root; skipped with the reason otherwise.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_spark_cluster import both_directions, on_standalone
from tests.fixtures.spark_cluster import StandaloneCluster, wait_for_executors
from tests.harness import HERDER, Processes, port_open, wait_until
from tests.nemesis.hosts import Host, Network, unavailable_reason
from tests.nemesis.soak import (
    CLIENT_PORT,
    REST_PORT,
    ensemble_properties,
    herder_start,
    rest_ready,
    rest_url,
    start_in,
    worker_properties,
    write_properties,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

REASON = unavailable_reason()


@pytest.fixture
def network() -> Iterator[Network]:
    if REASON is not None:
        pytest.skip(f"network namespaces unavailable: {REASON}")
    net = Network()
    try:
        yield net
    finally:
        net.close()


class OnHosts:
    """What the pipelines ask of a cluster, asked over the bridge: connectors created
    through one worker's REST API, statuses read from the other's."""

    def __init__(self, http: httpx.Client, workers: list[Host], ensemble: Host) -> None:
        self.http = http
        self.workers = workers
        self.bootstrap = f"{ensemble.address}:{CLIENT_PORT}"

    def create(self, name: str, config: dict[str, str]) -> None:
        def created() -> bool:
            reply = self.http.post(
                f"{rest_url(self.workers[0])}/connectors", json={"name": name, "config": config}
            )
            # a 409 is Connect's "try again" while a rebalance (the other worker joining) is
            # under way; the other 409, a connector of that name already there, is not
            retry = reply.status_code == 409 and "already exists" not in reply.text
            assert reply.status_code == 201 or retry, reply.text
            return reply.status_code == 201

        wait_until(created, timeout=60, interval=0.5, what=f"{name} to be created")

    def status(self, name: str) -> dict:  # type: ignore[type-arg]
        reply = self.http.get(f"{rest_url(self.workers[1])}/connectors/{name}/status")
        return reply.json()  # type: ignore[no-any-return]

    def describe_topic(self, topic: str) -> dict:  # type: ignore[type-arg]
        out = subprocess.run(
            [*HERDER, "topics", "describe", topic, "--bootstrap", self.bootstrap, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.timeout(900)
def test_pipelines_run_across_hosts(network: Network, processes: Processes, tmp_path: Path) -> None:
    ensemble = network.add_host("ens")
    master = network.add_host("sm")
    spark_workers = [network.add_host(f"sw{i}") for i in (1, 2)]
    workers = [network.add_host(f"w{i}") for i in (1, 2)]

    data = tmp_path / "ensemble"
    data.mkdir()
    config = ensemble_properties(1, data, {1: ensemble})
    start_in(
        processes,
        ensemble,
        herder_start("ensemble", write_properties(tmp_path / "ensemble.properties", config)),
        name="ensemble",
        ready=lambda: port_open(CLIENT_PORT, ensemble.address),
    )
    spark = StandaloneCluster(cores=1, memory="1g", master_on=master, workers_on=spark_workers)
    http = httpx.Client(timeout=60)
    try:
        for index, host in enumerate(workers):
            props = {
                **worker_properties(host, f"{ensemble.address}:{CLIENT_PORT}", tmp_path / "topics"),
                "group.id": "multi-host",
                "rest.advertised.host.name": host.address,
                # one directory every host sees: the deployment's shared mount
                "storage.root.shared": "true",
                **on_standalone(spark),
                "spark.driver.host": host.address,
                "spark.ui.enabled": "false",
            }
            path = write_properties(tmp_path / f"worker{index}.properties", props)
            start_in(
                processes,
                host,
                herder_start("worker", path),
                name=f"worker{index}",
                env={"SPARK_LOCAL_IP": host.address},
            )
        for host in workers:
            wait_until(
                functools.partial(rest_ready, http, host),
                timeout=240,
                interval=0.5,
                what=f"the worker at {host.address} to answer",
            )
        cluster = OnHosts(http, workers, ensemble)

        def logs() -> str:
            return "".join(p.output() for p in processes.started if p.name.startswith("worker"))

        both_directions(cluster, tmp_path, logs)  # type: ignore[arg-type]  # what it asks of a Cluster

        # the tasks ran on both workers, each known by its own address
        addresses = {f"{host.address}:{REST_PORT}" for host in workers}
        owners = {
            task["worker_id"]
            for name in ("lines-in", "lines-out", "texts-in", "texts-out")
            for task in cluster.status(name)["tasks"]
        }
        assert owners <= addresses, owners
        # each worker's application held a core of the cluster, on a Spark Worker's host
        wait_for_executors(spark, "herder")
        apps = [a for a in spark.state()["activeapps"] if a["name"] == "herder"]
        assert len(apps) == 2 and all(a["cores"] == 1 for a in apps), apps
        used = {w["host"]: w["coresused"] for w in spark.alive_workers()}
        assert used == {h.address: 1 for h in spark_workers}, used
        assert spark.executor_dirs(), "no executor was launched on the cluster"
    finally:
        http.close()
        spark.stop()
