"""A deterministic simulation of the group coordinator core: one seed, one history.

The real :class:`~herder.coordinator.GroupCoordinator` serves a group of simulated
members (``clients``), static and dynamic, that behave as the group member client
does: join (answering MEMBER_ID_REQUIRED), sync, heartbeat, commit offsets, rejoin
when told to. Faults come from the seed: members crash, stop, leave, restart (a static
one sometimes while its old process runs on as a zombie), change their metadata;
requests and responses are delayed, reordered and lost; store writes are slow or fail;
the coordinator fails over (every group unloaded, then loaded into a fresh coordinator
from the ``_groups`` records, sometimes with a different ``group.max.size``). Time is
simulated. :mod:`~tests.sim.coordinator.checker` checks the invariants after every step.

Run or replay: ``python -m tests.sim.coordinator --seed N [--trace] [--bug NAME]``.
"""
