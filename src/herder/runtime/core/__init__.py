"""Pure cores of the worker runtime: protocols and decisions as state machines.

A core does no IO, reads no clock, starts no task and draws no randomness of its own:
it is fed events with the current time (``now_ms``) and a ``random.Random`` at
construction, and it answers with the effects to carry out. The asyncio shells in
:mod:`herder.runtime.shell` feed the cores real sockets and the real clock; the
simulator (``tests/sim/connect``) feeds them a fake network and a fake clock, and
replays a failing seed exactly.

* :mod:`.member`: the group member's protocol (Kafka's AbstractCoordinator).
* :mod:`.herder`: everything the distributed herder decides (its effects in
  :mod:`.effects`, the errors of request admission in :mod:`.admission`).
* beside them, the pure pieces they decide with: the worker protocol's metadata and
  assignments (:mod:`.protocol`), the eager assignor (:mod:`.assignor`), the config
  log's state (:mod:`.config_state`), statuses (:mod:`.status`), restart plans
  (:mod:`.restart`) and the herder's rules and schedules (:mod:`.rules`).
"""
