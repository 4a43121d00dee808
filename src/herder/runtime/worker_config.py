"""A worker's configuration, with Kafka Connect's names wherever Connect has one."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from herder.config import ConfigDef, Importance, Range, Type, ValidString
from herder.ensemble.security import client_security
from herder.errors import ConfigError
from herder.runtime.basic_auth import (
    BASIC_AUTH_EXTENSIONS,
    Credentials,
    Users,
    authorization_header,
)
from herder.runtime.core.session_key import (
    DEFAULT_ALGORITHM,
    DEFAULT_KEY_TTL_MS,
    KeyPolicy,
    check_algorithm,
)
from herder.runtime.instance_ids import validate_group_instance_id
from herder.runtime.stores import DEFAULT_CONFIG_LOG, DEFAULT_OFFSET_LOG, DEFAULT_STATUS_LOG
from herder.runtime.tls import RestTls, listener_scheme
from herder.wire.auth import ClientSecurity
from herder.wire.tls import SettingNames


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
        documentation="REST listener, e.g. http://127.0.0.1:8083 (wins over rest.port); "
        "https://host:port serves HTTPS with the ssl.* settings below.",
    )
    .define("ssl.keystore.type", Type.STRING, default="PEM", importance=Importance.MEDIUM,
            documentation="The keystore's format: PEM, the only one herder reads. Every "
                          "ssl.* setting may be given as listeners.https.ssl.*, which wins.")
    .define("ssl.keystore.location", Type.STRING, default=None, importance=Importance.HIGH,
            documentation="A PEM file with the worker's certificate chain and private key, "
                          "for an https listener and for the worker's requests to others.")
    .define("ssl.keystore.certificate.chain", Type.STRING, default=None,
            importance=Importance.LOW,
            documentation="The certificate chain in PEM, inline (with ssl.keystore.key, "
                          "instead of ssl.keystore.location).")
    .define("ssl.keystore.key", Type.PASSWORD, default=None, importance=Importance.LOW,
            documentation="The private key in PEM, inline.")
    .define("ssl.key.password", Type.PASSWORD, default=None, importance=Importance.HIGH,
            documentation="The password of an encrypted private key.")
    .define("ssl.truststore.type", Type.STRING, default="PEM", importance=Importance.MEDIUM,
            documentation="The truststore's format: PEM only.")
    .define("ssl.truststore.location", Type.STRING, default=None, importance=Importance.HIGH,
            documentation="A PEM file of the CA certificates trusted for clients' "
                          "certificates and for other workers' (unset: the system's CAs).")
    .define("ssl.client.authentication", Type.STRING, default="none",
            validator=ValidString.in_("none", "requested", "required"),
            importance=Importance.MEDIUM,
            documentation="Whether REST clients must present a certificate signed by the "
                          "truststore: none, requested or required.")
    .define("rest.extension.classes", Type.LIST, default="", importance=Importance.LOW,
            documentation="REST extensions. "
                          "org.apache.kafka.connect.rest.basic.auth.extension."
                          "BasicAuthSecurityRestExtension (or "
                          "herder.runtime.basic_auth.BasicAuthFilter) turns on HTTP Basic "
                          "authentication against rest.basic.auth.credentials.file; no "
                          "other extension is supported.")
    .define("rest.basic.auth.credentials.file", Type.STRING, default=None,
            importance=Importance.MEDIUM,
            documentation="The users of the REST API, one 'user: password,role' line each "
                          "(Jetty's property file login format); role read allows GET and "
                          "HEAD, admin everything (herder's name).")
    .define("rest.basic.auth.internal.user", Type.STRING, default=None,
            importance=Importance.MEDIUM,
            documentation="The user (an admin) this worker sends its own requests to other "
                          "workers as, when authentication is on (herder's name).")
    .define("rest.basic.auth.internal.password", Type.PASSWORD, default=None,
            importance=Importance.MEDIUM,
            documentation="That user's password (herder's name).")
    # how the worker reaches the ensemble: Kafka's client security names under ensemble.
    .define("ensemble.security.protocol", Type.STRING, default="PLAINTEXT",
            importance=Importance.HIGH,
            documentation="PLAINTEXT, SSL (TLS to secureClientPort), SASL_PLAINTEXT or "
                          "SASL_SSL (either, authenticated as ensemble.sasl.username).")
    .define("ensemble.ssl.truststore.location", Type.STRING, default=None,
            importance=Importance.HIGH,
            documentation="PEM file of the CAs that sign the ensemble servers' certificates "
                          "(default: the system's).")
    .define("ensemble.ssl.truststore.type", Type.STRING, default="PEM",
            importance=Importance.LOW, documentation="PEM: the only type herder reads.")
    .define("ensemble.ssl.keystore.location", Type.STRING, default=None,
            importance=Importance.HIGH,
            documentation="PEM file with the worker's certificate and key, for servers that "
                          "ask for one (ssl.clientAuth=want|need).")
    .define("ensemble.ssl.keystore.type", Type.STRING, default="PEM",
            importance=Importance.LOW, documentation="PEM: the only type herder reads.")
    .define("ensemble.ssl.key.password", Type.PASSWORD, default=None,
            importance=Importance.MEDIUM, documentation="Password of that key, if encrypted.")
    .define("ensemble.ssl.endpoint.identification.algorithm", Type.STRING, default="https",
            importance=Importance.LOW,
            documentation="https: a server's certificate must name the address dialled; "
                          "empty: it need not.")
    .define("ensemble.sasl.mechanism", Type.STRING, default="PLAIN", importance=Importance.LOW,
            documentation="PLAIN: the only mechanism the ensemble serves.")
    .define("ensemble.sasl.username", Type.STRING, default=None, importance=Importance.HIGH,
            documentation="The ensemble user (sasl.users.file) the worker authenticates as.")
    .define("ensemble.sasl.password", Type.PASSWORD, default=None,
            importance=Importance.HIGH, documentation="That user's password.")
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
    .define("storage.root.shared", Type.BOOLEAN, default=False, importance=Importance.MEDIUM,
            documentation="Declare a local storage.root a mount every worker and Spark "
                          "executor has (NFS and the like), so it may be used with a Spark "
                          "cluster.")
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
    storage_root_shared: bool = False
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
    #: the TLS settings of an ``https`` listener (None: plain HTTP)
    tls: RestTls | None = None
    #: the REST API's users, when basic authentication is on
    users: Users | None = None
    #: what this worker's own requests to other workers authenticate as
    internal_credentials: Credentials | None = None
    #: TLS and the user the worker reaches the ensemble with (None: plain, anonymous)
    ensemble_security: ClientSecurity | None = None

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> WorkerConfig:
        known = {k: v for k, v in props.items() if k in WORKER_CONFIG}
        v = WORKER_CONFIG.parse(known)
        rest_host, rest_port = v["rest.host.name"], v["rest.port"]
        tls = None
        for listener in v["listeners"]:
            if listener_scheme(listener) == "https":
                tls = RestTls.from_properties({str(k): str(val) for k, val in props.items()})
            _, _, hostport = listener.rpartition("://")
            host, _, port = hostport.rpartition(":")
            rest_host, rest_port = host or rest_host, int(port)
            break
        users, internal = _basic_auth(v)
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
            storage_root_shared=v["storage.root.shared"],
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
            tls=tls,
            users=users,
            internal_credentials=internal,
            ensemble_security=_ensemble_security(v),
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
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.advertised_address(bound_port)}"

    def http_client(self, timeout_s: float) -> httpx.AsyncClient:
        """A client for this worker's requests to other workers: over TLS with the
        worker's truststore and certificate, as its internal user when authentication is
        on (a forwarded request sets its sender's ``Authorization`` instead)."""
        headers = {}
        if self.internal_credentials is not None:
            headers["authorization"] = authorization_header(self.internal_credentials)
        verify: ssl.SSLContext | bool = True
        if self.tls is not None:
            verify = self.tls.client_context()
        return httpx.AsyncClient(timeout=timeout_s, verify=verify, headers=headers)

    def spark_properties(self) -> dict[str, str]:
        return {k: v for k, v in self.originals.items() if k.startswith("spark.")}


def _basic_auth(v: Mapping[str, Any]) -> tuple[Users | None, Credentials | None]:
    extensions = [str(name).strip() for name in v["rest.extension.classes"] if str(name).strip()]
    unknown = [name for name in extensions if name not in BASIC_AUTH_EXTENSIONS]
    if unknown:
        raise ConfigError(
            f"Invalid value {','.join(unknown)} for configuration rest.extension.classes: "
            "herder supports only "
            "org.apache.kafka.connect.rest.basic.auth.extension.BasicAuthSecurityRestExtension"
        )
    user, password = v["rest.basic.auth.internal.user"], v["rest.basic.auth.internal.password"]
    internal = None
    if user is not None:
        internal = Credentials(user, password.value if password is not None else "")
    if not extensions:
        return None, internal
    path = v["rest.basic.auth.credentials.file"]
    if path is None:
        raise ConfigError(
            "rest.extension.classes turns on basic authentication: set "
            "rest.basic.auth.credentials.file to a file of 'user: password,role' lines"
        )
    users = Users.load(path)
    if internal is None:
        raise ConfigError(
            "with basic authentication on, workers authenticate to each other too: set "
            "rest.basic.auth.internal.user and rest.basic.auth.internal.password to an "
            f"admin user of {path}"
        )
    return users, internal


def _ensemble_security(v: Mapping[str, Any]) -> ClientSecurity | None:
    for store in ("ensemble.ssl.truststore.type", "ensemble.ssl.keystore.type"):
        if str(v[store]).upper() != "PEM":
            raise ConfigError(
                f"Invalid value {v[store]} for configuration {store}: herder reads PEM files "
                f"only; convert the store with `openssl pkcs12 -nodes` and set {store}=PEM"
            )
    if str(v["ensemble.sasl.mechanism"]).upper() != "PLAIN":
        raise ConfigError(
            f"Invalid value {v['ensemble.sasl.mechanism']} for configuration "
            "ensemble.sasl.mechanism: the ensemble serves PLAIN only (use it over SASL_SSL)"
        )
    key_password, password = v["ensemble.ssl.key.password"], v["ensemble.sasl.password"]
    return client_security(
        v["ensemble.security.protocol"],
        truststore=v["ensemble.ssl.truststore.location"],
        keystore=v["ensemble.ssl.keystore.location"],
        key_password=key_password.value if key_password is not None else None,
        username=v["ensemble.sasl.username"],
        password=password.value if password is not None else None,
        check_hostname=bool(v["ensemble.ssl.endpoint.identification.algorithm"]),
        names=SettingNames(
            keystore="ensemble.ssl.keystore.location",
            key_password="ensemble.ssl.key.password",
            truststore="ensemble.ssl.truststore.location",
        ),
    )


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
