"""The nemesis's hosts: namespaces that reach each other through the bridge, faults that
cut exactly the traffic they name, a disk that fills, and nothing left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nemesis.hosts import PREFIX, Host, Network, SmallDisk, remove_stale, unavailable_reason

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REASON = unavailable_reason()
if REASON is not None:
    pytestmark.append(pytest.mark.skip(reason=f"nemesis hosts unavailable: {REASON}"))

#: sends N UDP datagrams; or says "ready" once bound and counts what arrives until a
#: second passes without one
UDP = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if sys.argv[1] == "send":
    for _ in range(int(sys.argv[3])):
        try:
            s.sendto(b"x", (sys.argv[2], 9999))
        except PermissionError:  # dropped on its way out
            pass
        time.sleep(0.001)
else:
    s.bind((sys.argv[2], 9999))
    s.settimeout(1.0)
    print("ready", flush=True)
    count = 0
    try:
        while True:
            s.recv(100)
            count += 1
    except TimeoutError:
        print(count, flush=True)
"""


def datagrams(sender: Host, receiver: Host, sent: int = 1) -> int:
    """How many of ``sent`` datagrams from ``sender`` reach ``receiver``."""
    listener = subprocess.Popen(
        receiver.command([sys.executable, "-c", UDP, "recv", receiver.address]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "ready"
        subprocess.run(
            sender.command([sys.executable, "-c", UDP, "send", receiver.address, str(sent)]),
            check=True,
            timeout=30,
        )
        out, _ = listener.communicate(timeout=30)
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait(timeout=10)
    return int(out.strip())


@pytest.fixture
def network() -> Iterator[Network]:
    net = Network()
    try:
        yield net
    finally:
        net.close()


def test_hosts_reach_each_other_until_cut_and_again_once_healed(network: Network) -> None:
    a, b = network.add_host("a"), network.add_host("b")
    assert a.address != b.address
    assert datagrams(a, b) == 1 and datagrams(b, a) == 1
    a.drop_to([b])  # one way: a's packets to b are dropped, b's to a still arrive
    assert datagrams(a, b) == 0
    assert datagrams(b, a) == 1
    network.heal()
    assert datagrams(a, b) == 1
    a.lose(50)  # some get through, some not (500 sent: the odds of a wrong count are nil)
    assert 100 < datagrams(a, b, 500) < 400
    a.heal_network()
    a.slow(rate_kbit=64, latency_ms=200)  # slow, but it still gets through
    assert datagrams(a, b) == 1
    a.heal_network()
    assert datagrams(a, b, 200) == 200
    assert (
        "tbf"
        not in subprocess.run(
            a.command(["tc", "qdisc", "show", "dev", a.device]), capture_output=True, text=True
        ).stdout
    )


def test_close_leaves_nothing_and_stale_runs_are_removed(network: Network) -> None:
    host = network.add_host("c")
    network.close()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert host.namespace not in namespaces
    assert network.tag not in links
    # a namespace left by a run whose process is gone (pid 0x3fffff is above pid_max's
    # default, so it is no live process here)
    stale = f"{PREFIX}3fffffxs1"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        assert stale in remove_stale()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)
    assert (
        stale not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    )


def test_a_small_disk_fills_and_frees(tmp_path: Path) -> None:
    disk = SmallDisk(tmp_path / "data", size_mb=4)
    try:
        assert disk.fill() > 3 * 1024 * 1024
        with pytest.raises(OSError, match="No space left"):
            fd = os.open(tmp_path / "data" / "log", os.O_WRONLY | os.O_CREAT)
            try:
                os.write(fd, b"x" * 8192)
            finally:
                os.close(fd)
        disk.free()
        (tmp_path / "data" / "log").write_bytes(b"x" * 8192)
    finally:
        disk.close()
