"""The options every command that talks to the ensemble takes to reach a secured one.

``--cacert``/``--cert``/``--cert-key`` turn TLS on (for the servers' ``secureClientPort``;
``--tls`` alone trusts the system's CAs), ``--user``/``--password`` authenticate as a
user of the servers' ``sasl.users.file``. (``--cert-key``, not the REST commands'
``--key``: ``herder logs append`` has a ``--key`` of its own, the record's.) Each has an
environment variable, ``HERDER_ENSEMBLE_CACERT`` … ``HERDER_ENSEMBLE_PASSWORD``, as the
REST options have ``HERDER_CACERT`` ….
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any, TypeVar

import click

from herder.errors import HerderError
from herder.wire.auth import ClientSecurity

F = TypeVar("F", bound=Callable[..., Any])

_META = "herder.ensemble.security"
_OPTIONS = (
    ("--tls", "TLS to the ensemble's secure client port, trusting the system's CAs", True),
    ("--cacert", "PEM file of the CA that signs the ensemble servers' certificates", False),
    ("--cert", "PEM client certificate, for servers with ssl.clientAuth=want|need", False),
    ("--cert-key", "the private key of --cert, unless --cert holds it too", False),
    ("--user", "a user of the servers' sasl.users.file", False),
    ("--password", "that user's password", False),
)


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    assert param.name is not None
    ctx.meta.setdefault(_META, {})[param.name] = value
    return value


def ensemble_security_options(command: F) -> F:
    """Add the ensemble's TLS and authentication options to ``command``."""
    for flag, text, is_flag in reversed(_OPTIONS):
        env = f"HERDER_ENSEMBLE_{flag[2:].upper().replace('-', '_')}"
        command = click.option(
            flag,
            is_flag=is_flag,
            default=None if not is_flag else False,
            envvar=env,
            expose_value=False,
            callback=_remember,
            help=f"{text[0].upper()}{text[1:]} (env {env}).",
        )(command)
    return command


def ensemble_security() -> ClientSecurity | None:
    """What the current command's options ask for (None: plain, anonymous)."""
    ctx = click.get_current_context(silent=True)
    given: dict[str, Any] = ctx.meta.get(_META, {}) if ctx is not None else {}
    cacert, cert, key = given.get("cacert"), given.get("cert"), given.get("cert_key")
    user, password = given.get("user"), given.get("password")
    context = None
    if given.get("tls") or cacert or cert:
        try:
            context = ssl.create_default_context(cafile=cacert)
            if cert:
                context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise HerderError(
                f"cannot load --cacert/--cert/--cert-key: {exc}; give PEM files (--cert with "
                "the certificate, --cert-key with its private key unless --cert holds both)"
            ) from None
    if context is None and user is None:
        return None
    if user is not None and password is None:
        raise HerderError("--user needs --password (or HERDER_ENSEMBLE_PASSWORD)")
    return ClientSecurity(context, user, password)
