"""The JSON the REST API answers with."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

__all__ = ["JsonReply"]


class JsonReply(JSONResponse):
    """Starlette's JSON response, except that a string which is no valid Unicode (a lone
    surrogate, from a connector file, say, since the REST API refuses them) goes out as
    its JSON escape instead of failing the whole reply with a 500."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8", "backslashreplace")
