"""A worker's configuration, with Kafka Connect's names wherever Connect has one."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from herder.config import ConfigDef, Importance, Range, Type, ValidString
from herder.errors import ConfigError
from herder.runtime.core.session_key import (
    DEFAULT_ALGORITHM,
    DEFAULT_KEY_TTL_MS,
    KeyPolicy,
    check_algorithm,
)
from herder.runtime.instance_ids import validate_group_instance_id
from herder.runtime.stores import DEFAULT_CONFIG_LOG, DEFAULT_OFFSET_LOG, DEFAULT_STATUS_LOG


def _algorithm(name: str, value: Any, /) -> None:
    check_algorithm(str(value), name)


def _algorithms(name: str, value: Any, /) -> None:
    if not value:
        raise ConfigError(f"Invalid value for configuration {name}: name at least one algorithm")
    for algorithm in value:
        check_algorithm(str(algorithm), name)


def _key_size(name: str, value: Any, /) -> None:
    if value is not None and (value < 8 or value % 8):
        raise ConfigError(
            f"Invalid value {value} for configuration {name}: a key size in bits, a multiple "
            "of 8 of at least 8 (or unset, for the algorithm's own)"
        )


WORKER_CONFIG = (
    ConfigDef()
    .define(
        "group.id",
        Type.STRING,
        importance=Importance.HIGH,
        documentation="The worker group this worker belongs to.",
    )
    .define(
        "group.instance.id",
        Type.STRING,
        default=None,
        validator=validate_group_instance_id,
        importance=Importance.MEDIUM,
        documentation="A unique id of this worker that stays the same across its restarts "
        "(static membership, KIP-345): a worker restarted within session.timeout.ms takes "
        "its place in the group back with its connectors and tasks, and no other worker is "
        "rebalanced; its sink tasks derive static ids of their own from it. Unset (the "
        "default), the worker is a dynamic member and a restart rebalances the group. At "
        "most 249 of A-Z a-z 0-9 . _ -.",
    )
    .define(
        "bootstrap.servers",
        Type.LIST,
        default="127.0.0.1:2191",
        importance=Importance.HIGH,
        documentation="Ensemble servers' client addresses, host:port, comma-separated.",
    )
    .define(
        "listeners",
        Type.LIST,
        default="",
        importance=Importance.LOW,
        documentation="REST listener, e.g. http://127.0.0.1:8083 (wins over rest.port).",
    )
    .define("rest.host.name", Type.STRING, default="0.0.0.0", importance=Importance.LOW,
            documentation="Address the REST API binds to.")
    .define("rest.port", Type.INT, default=8083, validator=Range.between(0, 65535),
            importance=Importance.LOW, documentation="Port of the REST API (0 picks one).")
    .define("rest.advertised.host.name", Type.STRING, default="", importance=Importance.LOW,
            documentation="Host name other workers use to reach this one's REST API.")
    .define("rest.advertised.port", Type.INT, default=-1, importance=Importance.LOW,
            documentation="Port other workers use to reach this one's REST API.")
    .define("session.timeout.ms", Type.INT, default=10_000, validator=Range.at_least(1),
            importance=Importance.HIGH,
            documentation="How long the group waits for a silent worker before rebalancing.")
    .define("heartbeat.interval.ms", Type.INT, default=3_000, validator=Range.at_least(1),
            importance=Importance.HIGH, documentation="How often a worker heartbeats.")
    .define("rebalance.timeout.ms", Type.INT, default=60_000, validator=Range.at_least(1),
            importance=Importance.HIGH,
            documentation="How long workers get to rejoin once a rebalance began.")
    .define("worker.sync.timeout.ms", Type.INT, default=3_000, validator=Range.at_least(0),
            importance=Importance.MEDIUM,
            documentation="How long a worker behind the config log tries to catch up.")
    .define("worker.unsync.backoff.ms", Type.INT, default=300_000, validator=Range.at_least(0),
            importance=Importance.MEDIUM,
            documentation="How long a worker that could not catch up waits before rejoining.")
    .define("task.shutdown.graceful.timeout.ms", Type.INT, default=5_000,
            validator=Range.at_least(0), importance=Importance.LOW,
            documentation="How long to wait for tasks to stop before giving up on them.")
    .define("task.start.timeout.ms", Type.INT, default=60_000, validator=Range.at_least(1),
            importance=Importance.LOW,
            documentation="How long a task may take to start (its fencing, its offsets, its "
                          "start()) before it is FAILED (herder's name).")
    .define("connector.call.timeout.ms", Type.INT, default=60_000,
            validator=Range.at_least(1), importance=Importance.LOW,
            documentation="How long a call into connector code (start, task_configs, "
                          "validate) may take before it is given up on (herder's name).")
    .define("config.storage.topic", Type.STRING, default=DEFAULT_CONFIG_LOG,
            importance=Importance.HIGH, documentation="Ensemble log of connector configs.")
    .define("offset.storage.topic", Type.STRING, default=DEFAULT_OFFSET_LOG,
            importance=Importance.HIGH, documentation="Ensemble log of source offsets.")
    .define("status.storage.topic", Type.STRING, default=DEFAULT_STATUS_LOG,
            importance=Importance.HIGH, documentation="Ensemble log of statuses.")
    .define("connect.protocol", Type.STRING, default="sessioned",
            validator=ValidString.in_("eager", "compatible", "sessioned"),
            importance=Importance.LOW,
            documentation="The worker group protocol: eager (every rebalance stops "
                          "everything), compatible (incremental cooperative rebalancing, "
                          "KIP-415: only what moves stops) or sessioned (the same, with "
                          "internal requests signed by a session key, KIP-507). A group "
                          "speaks the newest protocol all of its workers offer.")
    .define("scheduled.rebalance.max.delay.ms", Type.INT, default=300_000,
            validator=Range.between(0, 2**31 - 1), importance=Importance.LOW,
            documentation="Under connect.protocol=compatible or sessioned, how long the "
                          "work of a worker that left stays unassigned, waiting for it to "
                          "come back, before it goes to the others (0: at once).")
    .define("inter.worker.key.ttl.ms", Type.INT, default=DEFAULT_KEY_TTL_MS,
            validator=Range.between(0, 2**31 - 1), importance=Importance.LOW,
            documentation="Under connect.protocol=sessioned, how long a session key "
                          "signs internal requests before the leader writes a new one "
                          "(0: it is never rotated).")
    .define("inter.worker.key.generation.algorithm", Type.STRING, default=DEFAULT_ALGORITHM,
            validator=_algorithm, importance=Importance.LOW,
            documentation="The algorithm the leader makes session keys for (Java's names: "
                          "HmacSHA256, HmacSHA512, ...).")
    .define("inter.worker.key.size", Type.INT, default=None,
            validator=_key_size, importance=Importance.LOW,
            documentation="The size of a session key in bits (unset: the algorithm's own).")
    .define("inter.worker.signature.algorithm", Type.STRING, default=DEFAULT_ALGORITHM,
            validator=_algorithm, importance=Importance.LOW,
            documentation="The algorithm internal requests are signed with.")
    .define("inter.worker.verification.algorithms", Type.LIST, default=[DEFAULT_ALGORITHM],
            validator=_algorithms, importance=Importance.LOW,
            documentation="The algorithms a signed internal request may use; must include "
                          "inter.worker.signature.algorithm.")
    .define("storage.root", Type.STRING, default="", importance=Importance.HIGH,
            documentation="Where topic data lives: a local path or a Hadoop filesystem URI.")
    .define("topic.tracking.enable", Type.BOOLEAN, default=True, importance=Importance.LOW,
            documentation="Record the topics each connector uses (GET /connectors/{c}/topics).")
    .define("topic.tracking.allow.reset", Type.BOOLEAN, default=True,
            importance=Importance.LOW,
            documentation="Allow PUT /connectors/{c}/topics/reset to forget them.")
    .define("rest.request.timeout.ms", Type.INT, default=90_000, validator=Range.at_least(1),
            importance=Importance.LOW,
            documentation="How long a REST request may take before it answers 500 (herder's "
                          "name; Connect fixes it at 90 s).")
)  # fmt: skip


@dataclass(frozen=True)
class WorkerConfig:
    group_id: str
    bootstrap: list[str]
    rest_host: str
    rest_port: int
    advertised_host: str
    advertised_port: int
    session_timeout_ms: int
    heartbeat_interval_ms: int
    rebalance_timeout_ms: int
    worker_sync_timeout_ms: int
    worker_unsync_backoff_ms: int
    task_shutdown_timeout_ms: int
    config_log: str
    offset_log: str
    status_log: str
    storage_root: str
    originals: dict[str, str]
    topic_tracking: bool = True
    topic_tracking_allow_reset: bool = True
    rest_request_timeout_ms: int = 90_000
    task_start_timeout_ms: int = 60_000
    connector_call_timeout_ms: int = 60_000
    #: a static worker's ``group.instance.id`` (None: a dynamic member)
    group_instance_id: str | None = None
    connect_protocol: str = "sessioned"
    scheduled_rebalance_max_delay_ms: int = 300_000
    #: the ``inter.worker.*`` settings of signed internal requests
    key_policy: KeyPolicy = field(default_factory=KeyPolicy)

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> WorkerConfig:
        known = {k: v for k, v in props.items() if k in WORKER_CONFIG}
        v = WORKER_CONFIG.parse(known)
        rest_host, rest_port = v["rest.host.name"], v["rest.port"]
        for listener in v["listeners"]:
            _, _, hostport = listener.rpartition("://")
            host, _, port = hostport.rpartition(":")
            rest_host, rest_port = host or rest_host, int(port)
            break
        return cls(
            group_id=v["group.id"],
            bootstrap=v["bootstrap.servers"],
            rest_host=rest_host,
            rest_port=rest_port,
            advertised_host=v["rest.advertised.host.name"],
            advertised_port=v["rest.advertised.port"],
            session_timeout_ms=v["session.timeout.ms"],
            heartbeat_interval_ms=v["heartbeat.interval.ms"],
            rebalance_timeout_ms=v["rebalance.timeout.ms"],
            worker_sync_timeout_ms=v["worker.sync.timeout.ms"],
            worker_unsync_backoff_ms=v["worker.unsync.backoff.ms"],
            task_shutdown_timeout_ms=v["task.shutdown.graceful.timeout.ms"],
            config_log=v["config.storage.topic"],
            offset_log=v["offset.storage.topic"],
            status_log=v["status.storage.topic"],
            storage_root=v["storage.root"],
            originals={str(k): str(val) for k, val in props.items()},
            topic_tracking=v["topic.tracking.enable"],
            topic_tracking_allow_reset=v["topic.tracking.allow.reset"],
            rest_request_timeout_ms=v["rest.request.timeout.ms"],
            task_start_timeout_ms=v["task.start.timeout.ms"],
            connector_call_timeout_ms=v["connector.call.timeout.ms"],
            group_instance_id=v["group.instance.id"],
            connect_protocol=v["connect.protocol"],
            scheduled_rebalance_max_delay_ms=v["scheduled.rebalance.max.delay.ms"],
            key_policy=_key_policy(v),
        )

    def advertised_address(self, bound_port: int) -> str:
        """``host:port`` other workers and clients reach this worker's REST API at
        (``rest.advertised.host.name``/``rest.advertised.port``, else where it listens):
        the worker's id in statuses, as in Connect."""
        host = self.advertised_host or self.rest_host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname() if self.rest_host not in ("0.0.0.0", "::") else "127.0.0.1"
        port = self.advertised_port if self.advertised_port > 0 else bound_port
        return f"{host}:{port}"

    def advertised_url(self, bound_port: int) -> str:
        return f"http://{self.advertised_address(bound_port)}"

    def spark_properties(self) -> dict[str, str]:
        return {k: v for k, v in self.originals.items() if k.startswith("spark.")}


def _key_policy(v: Mapping[str, Any]) -> KeyPolicy:
    signature = v["inter.worker.signature.algorithm"]
    verification = tuple(v["inter.worker.verification.algorithms"])
    if signature not in verification:
        raise ConfigError(
            f"Invalid value {signature} for configuration inter.worker.signature.algorithm: "
            "Signature algorithm must be present in inter.worker.verification.algorithms list"
        )
    return KeyPolicy(
        key_algorithm=v["inter.worker.key.generation.algorithm"],
        key_size_bits=v["inter.worker.key.size"],
        ttl_ms=v["inter.worker.key.ttl.ms"],
        signature_algorithm=signature,
        verification_algorithms=verification,
    )
