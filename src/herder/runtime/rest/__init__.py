"""The worker's REST API: Kafka Connect's paths, bodies and status codes.

Existing Connect clients work unchanged. One router per resource (:mod:`.connectors`,
:mod:`.tasks`, :mod:`.offsets`, :mod:`.connector_plugins`, :mod:`.admin_loggers`,
:mod:`.root`, :mod:`.internal`); what they show of connectors and tasks is in
:mod:`.views`. Changes to connectors belong to the group's leader, restarts to the
worker running the connector or task; any other worker forwards them there (see
:mod:`.routing`). Errors are Connect's ``{"error_code", "message"}`` with the status the
error's class declares (see :mod:`.errors`).
"""

from herder.runtime.rest.app import build_app

__all__ = ["build_app"]
