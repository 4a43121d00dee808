"""The nemesis's plan: which fault, on what, when and for how long — from a seed alone.

:func:`plan` is pure: the same seed, length and kinds give the same list of
:class:`Fault` s, so a run that found something is run again by its seed. Faults come one
at a time: each starts after a quiet gap, lasts its duration, and is healed before the
next begins, so every recovery is the recovery from one known fault. Kinds come in
rounds, every kind once per round in a seeded order, so a run of a few rounds has
struck with each. What a fault names
is fixed by the plan (server 2, worker 1, the split {1} | {2, 3}); the one thing decided
when it strikes is which server leads, for the faults aimed at the leader.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SERVERS = (1, 2, 3)
WORKERS = (1, 2, 3)

#: every kind of fault the nemesis injects
KINDS = (
    "kill-server",  # kill -9 of a server, restarted when healed
    "kill-worker",  # kill -9 of a worker, restarted when healed
    "pause-server",  # SIGSTOP, SIGCONT when healed
    "pause-worker",
    "isolate-leader",  # the leading server cut from every other host, both ways
    "split-servers",  # one server (with one worker) on the minority side, the rest apart
    "cut-workers",  # some workers cut from every server
    "one-way",  # one server's packets to the others dropped; theirs still reach it
    "lossy-link",  # a server's link drops a share of what it sends
    "slow-link",  # a server's link sends at a trickle through a short queue
    "disk-full",  # the small disk holding one server's data directory filled up
)


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` at ``at`` seconds into the run, healed ``duration`` s later."""

    at: float
    duration: float
    kind: str
    #: the servers it strikes (ids); for "isolate-leader", decided when it strikes
    servers: tuple[int, ...] = ()
    workers: tuple[int, ...] = ()
    #: a share of packets, for "lossy-link"
    percent: int = 0

    @property
    def heal_at(self) -> float:
        return self.at + self.duration


def plan(
    seed: int,
    seconds: float,
    *,
    kinds: tuple[str, ...] = KINDS,
    disk_server: int = 3,
    gap: tuple[float, float] = (6.0, 12.0),
    duration: tuple[float, float] = (4.0, 12.0),
) -> list[Fault]:
    """Faults for a run of ``seconds``, the last healed before it ends."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    rng = random.Random(seed)
    faults: list[Fault] = []
    round_left: list[str] = []
    now = rng.uniform(*gap)
    while True:
        if not round_left:
            round_left = list(kinds)
            rng.shuffle(round_left)
        kind = round_left.pop()
        length = round(rng.uniform(*duration), 1)
        if now + length > seconds:
            return faults
        faults.append(_aim(rng, round(now, 1), length, kind, disk_server))
        now += length + rng.uniform(*gap)


def _aim(rng: random.Random, at: float, length: float, kind: str, disk_server: int) -> Fault:
    server = rng.choice(SERVERS)
    worker = rng.choice(WORKERS)
    if kind in ("kill-server", "pause-server", "one-way", "slow-link"):
        return Fault(at, length, kind, servers=(server,))
    if kind == "lossy-link":
        return Fault(at, length, kind, servers=(server,), percent=rng.choice((10, 25, 40)))
    if kind in ("kill-worker", "pause-worker"):
        return Fault(at, length, kind, workers=(worker,))
    if kind == "split-servers":
        return Fault(at, length, kind, servers=(server,), workers=(worker,))
    if kind == "cut-workers":
        count = rng.choice((1, 1, 2, 3))
        return Fault(at, length, kind, workers=tuple(sorted(rng.sample(WORKERS, count))))
    if kind == "disk-full":
        return Fault(at, length, kind, servers=(disk_server,))
    return Fault(at, length, kind)  # isolate-leader: aimed when it strikes
