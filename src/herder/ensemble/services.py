"""Services that run on the ensemble leader, such as the group coordinator.

The ensemble knows nothing of what such a service does; it only tells the service when
this server becomes leader (load your state from the replicated logs) and when it stops
being leader (drop everything at once, so two leaders never judge the same thing), and
gives it a :class:`ServiceHost` to read the applied state and commit transactions.
Higher layers plug services in; the ensemble never imports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from herder.ensemble.state import StateMachine
from herder.ensemble.txn import Op, TxnResult
from herder.wire import WireServer


class ServiceHost(Protocol):
    """What an ensemble server offers the services it hosts."""

    @property
    def server_id(self) -> int: ...

    @property
    def state(self) -> StateMachine:
        """The applied state; read it, never change it."""
        ...

    @property
    def wire(self) -> WireServer:
        """The client port's server, to route the service's APIs on."""
        ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_change_ms(self) -> int:
        """The longest a leader change can leave the ensemble without a leader (0: never).

        A paused or cut-off leader is noticed after ``syncLimit`` x ``tickTime``, and an
        election follows; a standalone server has no leader change.
        """
        ...

    def leader_client_address(self) -> tuple[int, str] | None:
        """(server id, host:port) of the current leader's client port, if one is known."""
        ...

    async def commit(self, ops: Sequence[Op]) -> TxnResult:
        """Commit ``ops`` as one transaction of the leader's own (no client session).

        Raises NotLeader if this server is not (or stops being) the leader first.
        """
        ...


class LeaderService(Protocol):
    """A service hosted by every server and active only on the leader."""

    def attach(self, host: ServiceHost) -> None:
        """Called once before the server serves clients: route APIs, keep ``host``."""
        ...

    async def became_leader(self, epoch: int) -> None:
        """This server leads ``epoch`` and has applied everything before it: load."""
        ...

    def lost_leadership(self) -> None:
        """This server no longer leads (or is stopping): stop answering as leader now."""
        ...
