"""HTTP Basic authentication of a worker's REST API, with roles.

Kafka Connect's ``BasicAuthSecurityRestExtension`` checks users against a JAAS login
module, usually Jetty's ``PropertyFileLoginModule``; herder turns the same extension on by
the same ``rest.extension.classes`` name and reads the same file format directly:

    # user: password[,role ...]
    alice: secret,admin
    bob: other,read

Passwords are plain text (Jetty's ``OBF:``, ``MD5:`` and ``CRYPT:`` forms are refused,
saying so). Beyond Connect, roles decide what a user may do: ``read`` allows GET and HEAD,
``admin`` everything; a user with neither role is refused everything. ``GET /health``
stays open, for load balancers and orchestrators' probes; everything else, ``/metrics``
and the console at ``/ui`` included, needs a user (``read`` suffices for both).

A refusal is logged with the client's address, once per client and kind a minute
(:mod:`herder.runtime.refusals`): wrong credentials and a role's refusals as warnings, a
request without credentials at INFO (a browser's first request always comes without).

Workers send requests to each other (forwarded writes, task configs, cluster metrics);
with authentication on, each worker names the user it sends as with
``rest.basic.auth.internal.user`` and ``rest.basic.auth.internal.password`` (an
``admin`` of the credentials file). A forwarded request keeps its sender's credentials.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from herder.errors import ConfigError
from herder.runtime.refusals import RefusalLog, peer_of

__all__ = [
    "BASIC_AUTH_EXTENSIONS",
    "OPEN_PATHS",
    "BasicAuthFilter",
    "Credentials",
    "Users",
    "authorization_header",
]

#: the ``rest.extension.classes`` names that turn basic authentication on
BASIC_AUTH_EXTENSIONS = frozenset(
    {
        "org.apache.kafka.connect.rest.basic.auth.extension.BasicAuthSecurityRestExtension",
        "herder.runtime.basic_auth.BasicAuthFilter",
    }
)
READ, ADMIN = "read", "admin"
_READ_METHODS = frozenset({"GET", "HEAD"})
#: what anyone may GET without credentials: the health check, for probes
OPEN_PATHS = frozenset({"/health"})
_UNSUPPORTED_PASSWORDS = ("OBF:", "MD5:", "CRYPT:")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str


def authorization_header(credentials: Credentials) -> str:
    token = f"{credentials.user}:{credentials.password}".encode()
    return "Basic " + base64.b64encode(token).decode("ascii")


@dataclass(frozen=True)
class Users:
    """Who may use the REST API: each user's password and roles."""

    passwords: Mapping[str, str]
    roles: Mapping[str, frozenset[str]]

    @classmethod
    def parse(cls, text: str, source: str) -> Users:
        passwords: dict[str, str] = {}
        roles: dict[str, frozenset[str]] = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith(("#", "!")):
                continue
            # as Java properties: the key ends at the first ':' or '='
            cut = min((i for i in (line.find(":"), line.find("=")) if i >= 0), default=-1)
            sep = cut >= 0
            user, rest = (line[:cut], line[cut + 1 :]) if sep else (line, "")
            user = user.strip()
            fields = [f.strip() for f in rest.split(",")]
            if not sep or not user or not fields[0]:
                raise ConfigError(f"{source} line {number}: expected 'user: password[,role ...]'")
            if fields[0].startswith(_UNSUPPORTED_PASSWORDS):
                raise ConfigError(
                    f"{source} line {number}: user {user}'s password is in one of Jetty's "
                    "obfuscated or hashed forms, which herder does not read; write it in "
                    "plain text and keep the file readable by the worker alone"
                )
            passwords[user] = fields[0]
            roles[user] = frozenset(r for r in fields[1:] if r)
        return cls(passwords, roles)

    @classmethod
    def load(cls, path: str) -> Users:
        try:
            with open(path, encoding="utf-8") as file:
                return cls.parse(file.read(), path)
        except OSError as exc:
            raise ConfigError(
                f"cannot read rest.basic.auth.credentials.file {path}: {exc.strerror or exc}"
            ) from None

    def authenticate(self, header: str | None) -> str | None:
        """The user an ``Authorization`` header proves to be, or None."""
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, sep, password = decoded.partition(":")
        expected = self.passwords.get(user)
        if not sep or expected is None:
            # compare anyway, so an unknown user takes as long as a wrong password
            hmac.compare_digest(password.encode(), password.encode())
            return None
        if not hmac.compare_digest(password.encode(), expected.encode()):
            return None
        return user

    def may(self, user: str, method: str) -> bool:
        roles = self.roles.get(user, frozenset())
        return ADMIN in roles or (READ in roles and method in _READ_METHODS)


class BasicAuthFilter:
    """ASGI middleware: 401 without valid credentials, 403 for what a role does not allow."""

    def __init__(
        self, app: Asgi, users: Users, refusals: RefusalLog, realm: str = "herder"
    ) -> None:
        self.app = app
        self.users = users
        self.refusals = refusals
        self.realm = realm

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method = str(scope["method"]).upper()
        header = headers.get("authorization")
        user = self.users.authenticate(header)
        peer = peer_of(scope.get("client"))
        request = f"{method} {scope['path']}"
        if user is None:
            if header:
                self.refusals.refuse(
                    peer, "credentials", f"refused: {_wrong(header, self.users)} for {request}"
                )
            else:
                self.refusals.refuse(
                    peer, "anonymous", f"refused: no credentials for {request}", logging.INFO
                )
            await _refuse(
                send,
                401,
                "Authentication required: send HTTP Basic credentials of a user of this "
                "worker's credentials file",
                {"www-authenticate": f'Basic realm="{self.realm}"'},
            )
            return
        if not self.users.may(user, method):
            self.refusals.refuse(
                peer, "role", f"refused: user {user} may not {request}: its roles do not allow it"
            )
            await _refuse(
                send,
                403,
                f"User {user} may not {request}: that needs the admin role "
                "(the read role allows GET and HEAD only)",
                {},
            )
            return
        await self.app(scope, receive, send)


def _wrong(header: str, users: Users) -> str:
    """What is wrong with credentials, for the log: a known user's name, never a password
    (nor an unknown name, which may be a password typed in the wrong field)."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return "credentials that are not HTTP Basic"
    try:
        user = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")[0]
    except (binascii.Error, UnicodeDecodeError):
        return "undecodable HTTP Basic credentials"
    if user in users.passwords:
        return f"a wrong password for user {user}"
    return "an unknown user"


async def _refuse(send: Send, status: int, message: str, extra: dict[str, str]) -> None:
    body = json.dumps({"error_code": status, "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in extra.items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
