"""Thin asyncio shells around the pure cores of :mod:`herder.runtime.core`.

A shell owns no decision: it feeds its core the answers that arrive, the callbacks
that finish and the deadlines that pass (on the monotonic clock), and carries out the
effects the core returns over real connections.

* :mod:`.member`: :class:`~herder.runtime.shell.member.GroupMember`, a group
  membership kept alive over the shared coordinator connections.
* :mod:`.herder`: :class:`~herder.runtime.shell.herder.DistributedHerder`, one worker's
  herder loop, and :mod:`.requests`, the requests the REST API queues on it.
"""
