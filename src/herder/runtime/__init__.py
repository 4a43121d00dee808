"""The worker runtime: what a herder worker decides and how it keeps its view of the cluster.

Everything a distributed herder needs to agree with its peers lives here, as pure cores
with no IO: the worker group protocol (:mod:`.protocol`), the eager round-robin assignor
(:mod:`.assignor`), the in-memory view of the ``_configs`` log (:mod:`.config_state`),
connector and task status with its generation rule (:mod:`.status`), and connector plugin
discovery (:mod:`.plugins`), and the group member's protocol (:mod:`.core.member`). The
asyncio shells that feed them sockets and logs (:mod:`.shell`, the herder, the REST API)
build on these modules and never the other way round.
"""
