"""An ensemble server's configuration, with ZooKeeper's names.

``server.N=host:quorumPort:electionPort[:participant|:observer][;[clientHost:]clientPort]``
lines (ZooKeeper 3.5's dynamic-config syntax) list the ensemble, so every server knows
every other's client address; the server's own id comes from ``server.id`` or the
``myid`` file in ``dataDir``, as in ZooKeeper. A config without ``server.N`` lines is a
single standalone server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from herder.config import ConfigDef, Importance, Range, Type, load_properties, resolve
from herder.ensemble.security import EnsembleSecurity, define_security
from herder.errors import ConfigError

DEFAULT_CLIENT_PORT = 2191

ENSEMBLE_CONFIG = define_security(
    ConfigDef()
    .define(
        "dataDir",
        Type.STRING,
        importance=Importance.HIGH,
        documentation="Directory for snapshots, epoch files and (by default) the transaction log.",
    )
    .define(
        "dataLogDir",
        Type.STRING,
        default="",
        importance=Importance.MEDIUM,
        documentation="Directory for the transaction log (default: dataDir).",
    )
    .define(
        "clientPort",
        Type.INT,
        default=DEFAULT_CLIENT_PORT,
        validator=Range.between(0, 65535),
        importance=Importance.HIGH,
        documentation="Port for client connections (0 picks a free one).",
    )
    .define(
        "clientPortAddress",
        Type.STRING,
        default="0.0.0.0",
        importance=Importance.MEDIUM,
        documentation="Address the client port binds to.",
    )
    .define(
        "tickTime",
        Type.INT,
        default=2000,
        validator=Range.at_least(1),
        importance=Importance.MEDIUM,
        documentation="The basic time unit in milliseconds.",
    )
    .define(
        "initLimit",
        Type.INT,
        default=10,
        validator=Range.at_least(1),
        importance=Importance.MEDIUM,
        documentation="Ticks a learner may take to connect and sync with the leader.",
    )
    .define(
        "syncLimit",
        Type.INT,
        default=5,
        validator=Range.at_least(1),
        importance=Importance.MEDIUM,
        documentation="Ticks a learner may lag behind the leader before it is dropped.",
    )
    .define(
        "minSessionTimeout",
        Type.INT,
        default=-1,
        importance=Importance.LOW,
        documentation="Smallest session timeout granted, ms (default 2 x tickTime).",
    )
    .define(
        "maxSessionTimeout",
        Type.INT,
        default=-1,
        importance=Importance.LOW,
        documentation="Largest session timeout granted, ms (default 20 x tickTime).",
    )
    .define(
        "snapCount",
        Type.INT,
        default=100_000,
        validator=Range.at_least(2),
        importance=Importance.LOW,
        documentation="Transactions between snapshots (randomised a little per server).",
    )
    .define(
        "autopurge.snapRetainCount",
        Type.INT,
        default=3,
        validator=Range.at_least(3),
        importance=Importance.LOW,
        documentation="Snapshots (and the logs they need) kept.",
    )
    .define(
        "maxClientCnxns",
        Type.INT,
        default=60,
        validator=Range.at_least(0),
        importance=Importance.LOW,
        documentation="Connections one client address may hold open (0: no limit).",
    )
    .define(
        "preAllocSize",
        Type.INT,
        default=65536,
        validator=Range.at_least(1),
        importance=Importance.LOW,
        documentation="Size in KB by which transaction log files are preallocated.",
    )
    .define(
        "zookeeper.commitLogCount",
        Type.INT,
        default=500,
        validator=Range.at_least(1),
        importance=Importance.LOW,
        documentation="Committed transactions a server keeps in memory to sync learners from.",
    )
    .define(
        "zookeeper.snapshotSizeFactor",
        Type.DOUBLE,
        default=0.33,
        importance=Importance.LOW,
        documentation=(
            "A learner is synced from the on-disk log only while what it lacks is under this"
            " fraction of the snapshot's size (negative: never from the log)."
        ),
    )
    .define(
        "zookeeper.forceSnapshotSync",
        Type.BOOLEAN,
        default=False,
        importance=Importance.LOW,
        documentation="Always sync learners by snapshot.",
    )
    .define(
        "server.id",
        Type.INT,
        default=-1,
        importance=Importance.MEDIUM,
        documentation="This server's id; if unset, read from dataDir/myid.",
    )
    .define(
        "admin.enableServer",
        Type.BOOLEAN,
        default=True,
        importance=Importance.LOW,
        documentation="Whether admin.serverPort, when set, serves the admin HTTP endpoints.",
    )
    .define(
        "admin.serverPort",
        Type.INT,
        default=-1,
        validator=Range.between(-1, 65535),
        importance=Importance.MEDIUM,
        documentation=(
            "Port of the admin HTTP server: /commands/mntr, /commands/ruok and /metrics"
            " (-1: none; 0 picks a free one, logged)."
        ),
    )
    .define(
        "admin.serverAddress",
        Type.STRING,
        default="0.0.0.0",
        importance=Importance.LOW,
        documentation="Address the admin HTTP server binds to.",
    )
    .define(
        "metricsProvider.className",
        Type.STRING,
        default="",
        importance=Importance.LOW,
        documentation=(
            "Accepted for ZooKeeper's sake: metrics are always Prometheus's, served when"
            " metricsProvider.httpPort is set."
        ),
    )
    .define(
        "metricsProvider.httpPort",
        Type.INT,
        default=-1,
        validator=Range.between(-1, 65535),
        importance=Importance.MEDIUM,
        documentation="Port serving /metrics in Prometheus's text format (-1: none).",
    )
    .define(
        "metricsProvider.httpHost",
        Type.STRING,
        default="0.0.0.0",
        importance=Importance.LOW,
        documentation="Address the metrics port binds to.",
    )
    .define(
        "fsync.warningthresholdms",
        Type.INT,
        default=1000,
        validator=Range.at_least(0),
        importance=Importance.LOW,
        documentation="An fsync of the log slower than this, ms, is logged and counted.",
    )
    .define(
        "jute.maxbuffer",
        Type.INT,
        default=16 * 1024 * 1024,
        validator=Range.at_least(1024),
        importance=Importance.LOW,
        documentation="Largest frame accepted, bytes.",
    )
)

_SERVER_LINE = re.compile(r"^server\.(\d+)$")


@dataclass(frozen=True)
class PeerAddress:
    """One ``server.N`` line."""

    server_id: int
    host: str
    quorum_port: int
    election_port: int
    observer: bool
    client_host: str
    client_port: int

    @property
    def client_address(self) -> str:
        return f"{self.client_host}:{self.client_port}" if self.client_port else ""


@dataclass(frozen=True)
class EnsembleConfig:
    data_dir: Path
    data_log_dir: Path
    client_port: int
    client_address: str
    tick_time_ms: int
    init_limit: int
    sync_limit: int
    min_session_timeout_ms: int
    max_session_timeout_ms: int
    snap_count: int
    snap_retain_count: int
    max_client_connections: int
    prealloc_bytes: int
    max_frame_bytes: int
    server_id: int
    peers: dict[int, PeerAddress] = field(default_factory=dict)
    commit_log_count: int = 500
    snapshot_size_factor: float = 0.33
    force_snapshot_sync: bool = False
    #: (address, port) of the admin HTTP server, if it is on (port 0: a free one)
    admin_server: tuple[str, int] | None = None
    #: (address, port) of the Prometheus metrics port, if it is on
    metrics_server: tuple[str, int] | None = None
    fsync_warning_ms: int = 1000
    #: whether ``clientPort`` is served (a server with ``secureClientPort`` alone does not)
    plaintext_client: bool = True
    security: EnsembleSecurity = field(default_factory=EnsembleSecurity)

    @property
    def standalone(self) -> bool:
        return len(self.peers) <= 1

    @classmethod
    def from_file(cls, path: str | Path) -> EnsembleConfig:
        return cls.from_properties(load_properties(path))

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> EnsembleConfig:
        props = resolve(dict(props))
        if str(props.get("quorum.auth.enableSasl", "false")).strip().lower() == "true":
            raise ConfigError(
                "quorum.auth.enableSasl is not supported: servers authenticate each other by "
                "certificate, with sslQuorum=true and ssl.quorum.keyStore/trustStore.location"
            )
        values = ENSEMBLE_CONFIG.parse({k: v for k, v in props.items() if k in ENSEMBLE_CONFIG})
        tick = values["tickTime"]
        data_dir = Path(values["dataDir"]).expanduser()
        peers = {}
        for key, value in props.items():
            m = _SERVER_LINE.match(key)
            if m:
                peer = parse_server_line(int(m.group(1)), value)
                peers[peer.server_id] = peer
        server_id = values["server.id"]
        if server_id < 0:
            server_id = _read_myid(data_dir) if peers else 1
        if peers and server_id not in peers:
            raise ConfigError(f"server.id {server_id} has no server.{server_id} line in the config")
        min_timeout = values["minSessionTimeout"]
        max_timeout = values["maxSessionTimeout"]
        min_timeout = 2 * tick if min_timeout < 0 else min_timeout
        max_timeout = 20 * tick if max_timeout < 0 else max_timeout
        if min_timeout > max_timeout:
            raise ConfigError(
                f"minSessionTimeout {min_timeout} is larger than maxSessionTimeout {max_timeout}"
            )
        client_port = values["clientPort"]
        client_address = values["clientPortAddress"]
        me = peers.get(server_id)
        if me is not None and me.client_port and "clientPort" not in props:
            client_port = me.client_port
            client_address = me.client_host
        security = EnsembleSecurity.from_values(values, client_address)
        secure_port = security.secure_client_port
        # with a secure port, the plaintext one is served only if the config asks for it
        # (clientPort, or a server.N line naming another port than the secure one)
        plaintext_client = secure_port is None or (
            "clientPort" in props
            or (me is not None and bool(me.client_port) and me.client_port != secure_port)
        )
        if plaintext_client and secure_port and client_port == secure_port:
            raise ConfigError(
                f"clientPort and secureClientPort are both {secure_port}: give them different "
                "ports, or set client.portUnification=true and drop clientPort for one port "
                "that takes both"
            )
        return cls(
            data_dir=data_dir,
            data_log_dir=Path(values["dataLogDir"]).expanduser()
            if values["dataLogDir"]
            else data_dir,
            client_port=client_port,
            client_address=client_address,
            tick_time_ms=tick,
            init_limit=values["initLimit"],
            sync_limit=values["syncLimit"],
            min_session_timeout_ms=min_timeout,
            max_session_timeout_ms=max_timeout,
            snap_count=values["snapCount"],
            snap_retain_count=values["autopurge.snapRetainCount"],
            max_client_connections=values["maxClientCnxns"],
            prealloc_bytes=values["preAllocSize"] * 1024,
            max_frame_bytes=values["jute.maxbuffer"],
            server_id=server_id,
            peers=peers,
            commit_log_count=values["zookeeper.commitLogCount"],
            snapshot_size_factor=values["zookeeper.snapshotSizeFactor"],
            force_snapshot_sync=values["zookeeper.forceSnapshotSync"],
            admin_server=(values["admin.serverAddress"], values["admin.serverPort"])
            if values["admin.enableServer"] and values["admin.serverPort"] >= 0
            else None,
            metrics_server=(values["metricsProvider.httpHost"], values["metricsProvider.httpPort"])
            if values["metricsProvider.httpPort"] >= 0
            else None,
            fsync_warning_ms=values["fsync.warningthresholdms"],
            plaintext_client=plaintext_client,
            security=security,
        )


def parse_server_line(server_id: int, value: str) -> PeerAddress:
    """``host:quorumPort:electionPort[:participant|:observer][;[clientHost:]clientPort]``."""
    where = f"server.{server_id}={value}"
    quorum_part, _, client_part = value.partition(";")
    parts = quorum_part.strip().split(":")
    if len(parts) not in (3, 4):
        raise ConfigError(f"{where}: expected host:quorumPort:electionPort[:role][;clientPort]")
    host = parts[0]
    quorum_port = _port(parts[1], where)
    election_port = _port(parts[2], where)
    role = parts[3] if len(parts) == 4 else "participant"
    if role not in ("participant", "observer"):
        raise ConfigError(f"{where}: role must be participant or observer, not {role!r}")
    client_host, client_port = host, 0
    if client_part.strip():
        chost, sep, cport = client_part.strip().rpartition(":")
        client_host = chost if sep else "0.0.0.0"
        client_port = _port(cport, where)
        if client_host == "0.0.0.0":
            client_host = host
    return PeerAddress(
        server_id, host, quorum_port, election_port, role == "observer", client_host, client_port
    )


def _port(text: str, where: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a port number") from None
    if not 0 < port < 65536:
        raise ConfigError(f"{where}: port {port} is out of range")
    return port


def _read_myid(data_dir: Path) -> int:
    path = data_dir / "myid"
    try:
        return int(path.read_text().strip())
    except FileNotFoundError:
        raise ConfigError(f"no server.id in the config and no myid file at {path}") from None
    except ValueError:
        raise ConfigError(f"{path} does not hold a server id") from None
