"""The safety properties the simulator checks after every step.

* every server's applied history is a prefix of one common history, so an acknowledged
  (applied anywhere) write is never lost or replaced;
* a server applies only committed txns: ones that a quorum of participants has had on
  disk (observers do not count);
* at most one server leads each epoch: at most one ever finishes discovery for it;
* zxids strictly increase, in every log and in every applied history;
* no write is committed twice: every payload the simulator writes is unique, so the
  same payload at two places of the history is one client write applied twice.
"""

from __future__ import annotations

from herder.ensemble.zab import Txn, ZabConfig, hex_zxid


class SafetyViolation(AssertionError):
    pass


class Checker:
    def __init__(self, config: ZabConfig) -> None:
        self.config = config
        #: the longest history applied anywhere; all others must be prefixes of it
        self.history: list[Txn] = []
        #: how many txns each server has applied (its position in ``history``)
        self.applied: dict[int, int] = {}
        self.last_applied: dict[int, int] = {}
        #: epoch -> (server, incarnation) that finished discovery for it
        self.leaders: dict[int, tuple[int, int]] = {}
        #: txn -> participants that have ever had it on disk
        self.durable: dict[Txn, set[int]] = {}
        #: payload -> the zxid it was committed at
        self.committed_at: dict[bytes, int] = {}

    def on_durable(self, sid: int, txns: list[Txn]) -> None:
        if sid not in self.config.voters:
            return
        durable = self.durable
        for txn in txns:
            holders = durable.get(txn)
            if holders is None:
                durable[txn] = {sid}
            else:
                holders.add(sid)

    def on_restore(self, sid: int, state: list[Txn]) -> None:
        """``sid``'s state machine now holds ``state`` (a snapshot, at start or by SNAP)."""
        n = len(state)
        # whoever took the snapshot applied those txns first, so they are in the history
        if state != self.history[:n]:
            raise SafetyViolation(f"server {sid} restored a snapshot that diverges: {state!r}")
        self.applied[sid] = n
        self.last_applied[sid] = state[-1].zxid if state else 0

    def on_apply(self, sid: int, txn: Txn) -> None:
        index = self.applied.get(sid, 0)
        history = self.history
        if txn.zxid <= self.last_applied.get(sid, 0):
            raise SafetyViolation(
                f"server {sid} applied {hex_zxid(txn.zxid)} after "
                f"{hex_zxid(self.last_applied[sid])}"
            )
        holders = self.durable.get(txn, ())
        if len(holders) < self.config.quorum_size:
            raise SafetyViolation(
                f"server {sid} applied {hex_zxid(txn.zxid)} ({txn.payload!r}), on the disk "
                f"of only {sorted(holders)}: not committed"
            )
        if index < len(history):
            if history[index] != txn:
                raise SafetyViolation(
                    f"server {sid} applied {hex_zxid(txn.zxid)} ({txn.payload!r}) as txn "
                    f"#{index}, where others applied {hex_zxid(history[index].zxid)} "
                    f"({history[index].payload!r})"
                )
        else:
            first = self.committed_at.setdefault(txn.payload, txn.zxid)
            if first != txn.zxid:
                raise SafetyViolation(
                    f"write {txn.payload!r} committed twice: at {hex_zxid(first)} and at "
                    f"{hex_zxid(txn.zxid)}"
                )
            history.append(txn)
        self.applied[sid] = index + 1
        self.last_applied[sid] = txn.zxid

    def on_log_append(self, sid: int, last_zxid: int, txns: list[Txn]) -> None:
        for txn in txns:
            if txn.zxid <= last_zxid:
                raise SafetyViolation(
                    f"server {sid} logged {hex_zxid(txn.zxid)} after {hex_zxid(last_zxid)}"
                )
            last_zxid = txn.zxid

    def on_leading(self, epoch: int, sid: int, incarnation: int) -> None:
        holder = self.leaders.setdefault(epoch, (sid, incarnation))
        if holder != (sid, incarnation):
            raise SafetyViolation(
                f"two leaders for epoch {epoch}: server {holder[0]} (incarnation "
                f"{holder[1]}) and server {sid} (incarnation {incarnation})"
            )
