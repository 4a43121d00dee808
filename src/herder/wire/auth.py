"""Who a connection is, and what it may do: principals, users, the access policy.

A connection starts *anonymous*. It becomes a principal in one of two ways, ZooKeeper's
auth schemes under their names:

* ``sasl``: the client sends SaslAuthenticate with the PLAIN mechanism (RFC 4616, as
  Kafka's SaslAuthenticate carries it) right after ApiVersions, and the server checks the
  user and password against its users file;
* ``x509``: the client presented a certificate the server's truststore verifies, and the
  certificate's common name is the principal.

A principal has a role: ``read`` (every request that changes nothing) or ``write``
(everything). Which requests write is a property of each API (:attr:`Api.writes`), so a
new API says so where it is declared.
"""

from __future__ import annotations

import hmac
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from herder.errors import AuthenticationFailed, ConfigError, NotAuthorized
from herder.wire.envelope import Api

__all__ = [
    "ANONYMOUS",
    "READ",
    "SASL_AUTHENTICATE",
    "SCHEMES",
    "WRITE",
    "AccessPolicy",
    "ClientSecurity",
    "Principal",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "Users",
    "plain_auth_bytes",
]

READ, WRITE = "read", "write"
ROLES = (READ, WRITE)
SCHEMES = frozenset({"sasl", "x509"})
ACCESS = ("none", READ, WRITE)


class SaslAuthenticateRequest(msgspec.Struct, kw_only=True):
    mechanism: str = "PLAIN"
    auth_bytes: bytes = b""


class SaslAuthenticateResponse(msgspec.Struct, kw_only=True):
    principal: str = ""
    role: str = ""


#: Kafka's key for SaslAuthenticate
SASL_AUTHENTICATE: Api[SaslAuthenticateRequest, SaslAuthenticateResponse] = Api(
    36, "SaslAuthenticate", SaslAuthenticateRequest, SaslAuthenticateResponse
)


@dataclass(frozen=True)
class Principal:
    """Who a connection proved to be, how, and the role that gives it."""

    name: str
    scheme: str
    role: str | None

    @property
    def anonymous(self) -> bool:
        return self.scheme == "anonymous"

    def __str__(self) -> str:
        return "an anonymous client" if self.anonymous else f"{self.scheme} principal {self.name}"


ANONYMOUS = Principal("anonymous", "anonymous", WRITE)


def plain_auth_bytes(user: str, password: str) -> bytes:
    """PLAIN's message: no authorisation identity, the user, the password (RFC 4616)."""
    return b"\0" + user.encode() + b"\0" + password.encode()


@dataclass(frozen=True)
class Users:
    """A users file: ``user: password[, role]`` per line, the REST credentials file's form.

    A user without a role, or with one that is neither ``read`` nor ``write``, is refused
    everything.
    """

    passwords: Mapping[str, str]
    roles: Mapping[str, str | None]

    @classmethod
    def parse(cls, text: str, source: str) -> Users:
        passwords: dict[str, str] = {}
        roles: dict[str, str | None] = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith(("#", "!")):
                continue
            cut = min((i for i in (line.find(":"), line.find("=")) if i >= 0), default=-1)
            fields = [f.strip() for f in line[cut + 1 :].split(",")] if cut >= 0 else []
            user = line[:cut].strip() if cut >= 0 else ""
            if not user or not fields or not fields[0]:
                raise ConfigError(f"{source} line {number}: expected 'user: password[, role]'")
            granted = [r for r in fields[1:] if r in ROLES]
            passwords[user] = fields[0]
            roles[user] = WRITE if WRITE in granted else (READ if granted else None)
        return cls(passwords, roles)

    @classmethod
    def load(cls, path: str, setting: str) -> Users:
        try:
            with open(path, encoding="utf-8") as file:
                return cls.parse(file.read(), path)
        except OSError as exc:
            raise ConfigError(f"cannot read {setting} {path}: {exc.strerror or exc}") from None

    def check(self, user: str, password: str) -> bool:
        expected = self.passwords.get(user)
        # compare even for an unknown user, so timing does not tell who exists
        match = hmac.compare_digest(
            (expected if expected is not None else "\0").encode(), password.encode()
        )
        return match and expected is not None


@dataclass(frozen=True)
class AccessPolicy:
    """What a server asks of its clients (ZooKeeper's ``enforce.auth.*``) and allows them."""

    enforce: bool = False
    schemes: frozenset[str] = frozenset({"sasl"})
    users: Users | None = None
    x509_writers: frozenset[str] = frozenset()
    anonymous_access: str = WRITE

    def anonymous(self) -> Principal:
        return Principal(
            "anonymous",
            "anonymous",
            self.anonymous_access if self.anonymous_access != "none" else None,
        )

    def certificate(self, common_name: str | None) -> Principal | None:
        """The principal a verified client certificate makes, if ``x509`` counts here."""
        if common_name is None or "x509" not in self.schemes:
            return None
        return Principal(common_name, "x509", WRITE if common_name in self.x509_writers else READ)

    def authenticate(self, request: SaslAuthenticateRequest) -> Principal:
        if request.mechanism.upper() != "PLAIN":
            raise AuthenticationFailed(
                f"SASL mechanism {request.mechanism} is not served here: use PLAIN"
            )
        if self.users is None or "sasl" not in self.schemes:
            raise AuthenticationFailed(
                "this server authenticates no users by password (sasl is not in its "
                "enforce.auth.schemes or it has no sasl.users.file)"
            )
        parts = request.auth_bytes.split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailed("malformed PLAIN message")
        try:
            user, password = parts[1].decode(), parts[2].decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("malformed PLAIN message") from None
        if not self.users.check(user, password):
            raise AuthenticationFailed(f"wrong user or password for user {user!r}")
        return Principal(user, "sasl", self.users.roles.get(user))

    def authorize(self, principal: Principal, api: Api[Any, Any]) -> None:
        """Refuse ``api`` to ``principal`` unless its role allows it."""
        if principal.role is None:
            if principal.anonymous:
                raise AuthenticationFailed(
                    f"{api.name} refused: this server requires authentication "
                    f"({', '.join(sorted(self.schemes))})"
                )
            raise NotAuthorized(f"{api.name} refused: {principal} has no role")
        if api.writes and principal.role != WRITE:
            raise NotAuthorized(f"{api.name} refused: {principal} may only read")

    @classmethod
    def build(
        cls,
        *,
        enforce: bool,
        schemes: Iterable[str],
        users_file: str | None,
        x509_writers: Iterable[str],
        anonymous_access: str | None,
    ) -> AccessPolicy:
        """A policy from config values, checked (``sasl.users.file`` is read here)."""
        wanted = frozenset(s.strip().lower() for s in schemes if s.strip())
        unknown = wanted - SCHEMES
        if unknown:
            raise ConfigError(
                f"Invalid value {','.join(sorted(unknown))} for configuration "
                "enforce.auth.schemes: the schemes are sasl and x509"
            )
        access = anonymous_access or ("none" if enforce else WRITE)
        if access not in ACCESS:
            raise ConfigError(
                f"Invalid value {access} for configuration anonymous.access: one of none, "
                "read, write"
            )
        if enforce and access == WRITE:
            raise ConfigError(
                "anonymous.access=write contradicts enforce.auth.enabled=true: set it to read "
                "or none"
            )
        if enforce and "sasl" in wanted and not users_file:
            raise ConfigError(
                "enforce.auth.schemes names sasl but sasl.users.file is not set: point it at "
                "a file of 'user: password, role' lines"
            )
        users = Users.load(users_file, "sasl.users.file") if users_file else None
        return cls(
            enforce=enforce,
            schemes=wanted,
            users=users,
            x509_writers=frozenset(w.strip() for w in x509_writers if w.strip()),
            anonymous_access=access,
        )


@dataclass(frozen=True)
class ClientSecurity:
    """How a client reaches a server: TLS (with its certificate, if it has one) and the
    user it authenticates as."""

    ssl_context: ssl.SSLContext | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def authenticates(self) -> bool:
        return self.user is not None
