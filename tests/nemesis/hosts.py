"""Hosts for the nemesis: one Linux network namespace and one IP address per process.

A :class:`Network` is a bridge in the root namespace with a private /24 that exists only
on it (``10.213.X.0/24``; the bridge itself is ``.1``, so the test process reaches every
host) and one :class:`Host` per process: a namespace, a veth pair with one end on the
bridge, an address, and an nftables table of its own through which the nemesis cuts or
thins its traffic. Every name starts with ``hn<pid of the test process, hex>x``, so two
runs never collide and the leftovers of a run that was killed are recognised (their
pid is gone) and removed by the next one. :meth:`Network.close` removes namespaces,
veths and the bridge, and is safe to call on a half-built network.

Faults a host can be given, each undone by :meth:`Host.heal_network`:

* :meth:`Host.drop_to` — packets from this host to others are dropped (a one-way cut;
  both ways when each side drops the other's);
* :meth:`Host.lose` — a share of every packet it sends is dropped at random;
* :meth:`Host.slow` — its link sends at a low rate through a token bucket with a short
  queue: queueing delay, and tail drops when the queue is full. (netem is what one would
  reach for; where the kernel has no ``sch_netem``, a token bucket is what adds delay.)
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: every namespace, bridge and veth of a run is named ``hn<pid hex>x…``
PREFIX = "hn"
_OWN_NAME = re.compile(rf"^{PREFIX}([0-9a-f]+)x")
_TABLE = "nemesis"


class HostsUnavailable(Exception):
    """Network namespaces cannot be made here; the message says why (a test skips)."""


def _run(args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=check)


def unavailable_reason() -> str | None:
    """Why hosts cannot be made on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the nemesis tests as root)"
    for tool in ("ip", "tc", "nft"):
        if shutil.which(tool) is None:
            package = "nftables" if tool == "nft" else "iproute2"
            return f"`{tool}` is not installed (apt-get install {package})"
    probe = f"{PREFIX}{os.getpid():x}xprobe"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    try:
        table = _run(
            ["ip", "netns", "exec", probe, "nft", "add", "table", "inet", "t"], check=False
        )
        if table.returncode != 0:
            return f"nftables does not work in a namespace here: {table.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def remove_stale() -> list[str]:
    """Remove namespaces and links of runs whose process is gone; return their names."""
    removed = []
    namespaces = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
    for line in namespaces:
        name = line.split(" ")[0]
        found = _OWN_NAME.match(name)
        if found and not _pid_alive(int(found.group(1), 16)):
            _run(["ip", "netns", "del", name], check=False)
            removed.append(name)
    links = _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines()
    for line in links:
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        found = _OWN_NAME.match(name)
        if found and not _pid_alive(int(found.group(1), 16)):
            _run(["ip", "link", "del", name], check=False)
            removed.append(name)
    return removed


def _subnets_in_use() -> set[ipaddress.IPv4Network]:
    out = _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    return {ipaddress.IPv4Interface(m.group(1)).network for m in re.finditer(r"inet (\S+)", out)}


@dataclass
class Host:
    """One namespace with one address on the network's bridge."""

    name: str
    namespace: str
    address: str
    #: the veth end inside the namespace
    device: str
    slowed: bool = field(default=False)

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` run inside this host's namespace (``ip netns exec`` execs it: the
        process started is the command itself, with its own pid)."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def _nft(self, *args: str) -> None:
        _run(self.command(["nft", *args]))

    def drop_to(self, others: Sequence[Host]) -> None:
        """Drop every packet this host sends to ``others``."""
        for other in others:
            self._nft("add", "rule", "inet", _TABLE, "out", "ip", "daddr", other.address, "drop")

    def lose(self, percent: int) -> None:
        """Drop ``percent`` % of the packets this host sends, at random."""
        self._nft(
            "add",
            "rule",
            "inet",
            _TABLE,
            "out",
            "numgen",
            "random",
            "mod",
            "100",
            "<",
            str(percent),
            "drop",
        )

    def slow(self, rate_kbit: int, latency_ms: int) -> None:
        """Send at ``rate_kbit`` through a queue that holds ``latency_ms`` of traffic."""
        _run(
            self.command(
                [
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    self.device,
                    "root",
                    "tbf",
                    "rate",
                    f"{rate_kbit}kbit",
                    "burst",
                    "4kb",
                    "latency",
                    f"{latency_ms}ms",
                ]
            )
        )
        self.slowed = True

    def heal_network(self) -> None:
        """Undo :meth:`drop_to`, :meth:`lose` and :meth:`slow`."""
        self._nft("flush", "chain", "inet", _TABLE, "out")
        if self.slowed:
            _run(self.command(["tc", "qdisc", "del", "dev", self.device, "root"]), check=False)
            self.slowed = False


class Network:
    """A bridge and its hosts; :meth:`close` removes all of it."""

    def __init__(self) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise HostsUnavailable(reason)
        remove_stale()
        self.tag = f"{PREFIX}{os.getpid():x}x"
        self.bridge = f"{self.tag}br"
        self.hosts: dict[str, Host] = {}
        self.subnet = self._pick_subnet()
        _run(["ip", "link", "del", self.bridge], check=False)
        try:
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self._address(1)}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
        except BaseException:
            self.close()
            raise

    def _pick_subnet(self) -> ipaddress.IPv4Network:
        in_use = _subnets_in_use()
        start = os.getpid() % 250
        for i in range(250):
            candidate = ipaddress.IPv4Network(f"10.213.{(start + i) % 250 + 1}.0/24")
            if not any(candidate.overlaps(net) for net in in_use):
                return candidate
        raise HostsUnavailable("every 10.213.x.0/24 is in use on this machine")

    def _address(self, index: int) -> str:
        return str(self.subnet.network_address + index)

    @property
    def gateway(self) -> str:
        """The bridge's address: the test process, as every host sees it."""
        return self._address(1)

    def add_host(self, name: str) -> Host:
        """A namespace ``<tag><name>`` on the bridge with the next free address."""
        index = len(self.hosts) + 2
        namespace = f"{self.tag}{name}"
        outer, inner = f"{self.tag}{name}", f"{self.tag}{name}p"  # one per namespace
        if len(inner) > 15:
            raise ValueError(f"host name {name!r} makes an interface name over 15 characters")
        host = Host(name, namespace, self._address(index), inner)
        self.hosts[name] = host
        _run(["ip", "netns", "del", namespace], check=False)
        _run(["ip", "netns", "add", namespace])
        _run(
            ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", namespace]
        )
        _run(["ip", "link", "set", outer, "master", self.bridge])
        _run(["ip", "link", "set", outer, "up"])
        inside = ["ip", "netns", "exec", namespace]
        _run([*inside, "ip", "link", "set", "lo", "up"])
        _run([*inside, "ip", "addr", "add", f"{host.address}/24", "dev", inner])
        _run([*inside, "ip", "link", "set", inner, "up"])
        _run([*inside, "nft", "add", "table", "inet", _TABLE])
        _run(
            [
                *inside,
                "nft",
                "add",
                "chain",
                "inet",
                _TABLE,
                "out",
                "{ type filter hook output priority 0; policy accept; }",
            ]
        )
        return host

    def heal(self) -> None:
        """Every host's traffic flows again."""
        for host in self.hosts.values():
            host.heal_network()

    def close(self) -> None:
        """Remove every namespace (their veth ends go with them) and the bridge."""
        for host in self.hosts.values():
            _run(["ip", "netns", "del", host.namespace], check=False)
            _run(["ip", "link", "del", f"{self.tag}{host.name}"], check=False)
        self.hosts.clear()
        _run(["ip", "link", "del", self.bridge], check=False)


class SmallDisk:
    """A size-limited filesystem (tmpfs) mounted on a directory, which can be filled up."""

    def __init__(self, mountpoint: Path, size_mb: int) -> None:
        self.mountpoint = mountpoint
        mountpoint.mkdir(parents=True, exist_ok=True)
        _run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(mountpoint)])
        self.filler = mountpoint / ".nemesis-filler"

    def fill(self) -> int:
        """Take every free byte; return how many were taken."""
        taken, size = 0, 1 << 20
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            while size >= 4096:  # smaller and smaller writes take the last bytes too
                try:
                    taken += os.write(fd, b"\0" * size)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    size //= 4
        finally:
            os.close(fd)
        return taken

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()

    def close(self) -> None:
        self.free()
        _run(["umount", "-l", str(self.mountpoint)], check=False)
