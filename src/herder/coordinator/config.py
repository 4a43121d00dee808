"""The group coordinator's settings, under Kafka's broker config names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from herder.errors import ConfigError

#: Kafka's property name for each field, so an operator's broker settings carry over
PROPERTY_NAMES: dict[str, str] = {
    "group_min_session_timeout_ms": "group.min.session.timeout.ms",
    "group_max_session_timeout_ms": "group.max.session.timeout.ms",
    "group_max_size": "group.max.size",
    "group_initial_rebalance_delay_ms": "group.initial.rebalance.delay.ms",
    "group_new_member_join_timeout_ms": "group.new.member.join.timeout.ms",
    "offsets_retention_minutes": "offsets.retention.minutes",
    "offsets_retention_check_interval_ms": "offsets.retention.check.interval.ms",
    "offset_metadata_max_bytes": "offset.metadata.max.bytes",
}


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Bounds and delays the coordinator applies to every group.

    The defaults are Kafka's, except ``group_initial_rebalance_delay_ms``: Kafka waits
    3 s for more members before a new group's first rebalance, herder does not unless
    asked, because its worker groups are small and tests should not wait.

    ``group_new_member_join_timeout_ms`` is how long a member that has never been in a
    generation may wait in a rebalance before it is dropped (Kafka's
    ``NewMemberJoinTimeoutMs``, KIP-394): a client that gave up on its JoinGroup and
    went away must not hold the rebalance, or the group's size, for the whole rebalance
    timeout. Kafka fixes it at 5 minutes; herder lets it be set, but it must stay well
    above the members' heartbeat intervals: the members already in the group learn of
    the rebalance a newcomer starts from a heartbeat answer, and a newcomer that expires
    before they rejoin never gets in.
    """

    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    group_max_size: int = 2**31 - 1
    group_initial_rebalance_delay_ms: int = 0
    group_new_member_join_timeout_ms: int = 300_000
    offsets_retention_minutes: int = 7 * 24 * 60
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4096

    def __post_init__(self) -> None:
        for name, minimum in (
            ("group_min_session_timeout_ms", 0),
            ("group_max_size", 1),
            ("group_initial_rebalance_delay_ms", 0),
            ("group_new_member_join_timeout_ms", 1),
            ("offsets_retention_minutes", 1),
            ("offsets_retention_check_interval_ms", 1),
            ("offset_metadata_max_bytes", 0),
        ):
            if getattr(self, name) < minimum:
                raise ConfigError(f"{PROPERTY_NAMES[name]} must be at least {minimum}")
        if self.group_max_session_timeout_ms < self.group_min_session_timeout_ms:
            raise ConfigError(
                "group.max.session.timeout.ms must not be below group.min.session.timeout.ms"
            )

    @property
    def offsets_retention_ms(self) -> int:
        return self.offsets_retention_minutes * 60_000

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> CoordinatorConfig:
        """Read the settings from Kafka-named properties; other keys are left alone.

        A value that is not an integer is refused with one line naming the key.
        """
        values: dict[str, int] = {}
        for field in fields(cls):
            key = PROPERTY_NAMES[field.name]
            if key in properties:
                raw = properties[key].strip()
                try:
                    values[field.name] = int(raw)
                except ValueError:
                    raise ConfigError(f"{key} must be an integer, not {raw!r}") from None
        return cls(**values)
