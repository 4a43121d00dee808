"""The simulated worlds a seed can draw: how lossy, crashy and partitioned they are."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Profile:
    """How hostile the simulated world is; times in simulated milliseconds."""

    drop: float = 0.005
    duplicate: float = 0.01
    delay_ms: tuple[int, int] = (1, 4)
    #: chance of a long delay, which reorders the message past later ones
    spike: float = 0.002
    spike_ms: int = 40
    disk_ms: tuple[int, int] = (1, 8)
    fault_every_ms: int = 400
    write_every_ms: int = 20
    downtime_ms: tuple[int, int] = (20, 1500)
    partition_ms: tuple[int, int] = (50, 2000)
    corruption: float = 0.1
    crash_after_critical: float = 0.01

    def calm(self) -> Profile:
        """The same world once the faults stop: no loss, no duplicates, no spikes."""
        return replace(self, drop=0.0, duplicate=0.0, spike=0.0)


#: the worlds a seed may draw: each stresses a different part of the protocol
PROFILES = {
    "default": Profile(),
    # crashes right after the packets whose promises must be durable
    "crashy": Profile(crash_after_critical=0.05, fault_every_ms=800),
    "lossy": Profile(drop=0.01, duplicate=0.05, spike=0.005),
    "partitioned": Profile(fault_every_ms=250, partition_ms=(20, 600)),
    # not drawn at random: too hostile for the liveness check, but the quickest way to
    # provoke a missing fsync of acceptedEpoch
    "hunting": Profile(crash_after_critical=0.2),
}
DRAWN = ("crashy", "default", "lossy", "partitioned")
