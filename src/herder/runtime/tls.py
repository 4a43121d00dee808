"""HTTPS for a worker's REST API, configured with Kafka Connect's SSL names.

``listeners=https://host:port`` turns TLS on. Its settings are read as Connect reads them:
``listeners.https.ssl.<name>`` wins over ``ssl.<name>``. Keys and certificates are PEM
files (``ssl.keystore.type=PEM``): the keystore holds the worker's certificate chain and
private key (or ``ssl.keystore.certificate.chain`` and ``ssl.keystore.key`` hold them
inline), the truststore the CA certificates the worker trusts, for the clients it checks
and for the other workers it sends requests to. The worker presents its own certificate
on those requests, so workers that require client certificates can reach each other.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass

from herder.errors import ConfigError
from herder.wire.tls import PemStores

__all__ = ["CLIENT_AUTHENTICATION", "RestTls", "listener_scheme"]

#: ``ssl.client.authentication``: whether clients must present a certificate
CLIENT_AUTHENTICATION = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}
_LISTENER_PREFIX = "listeners.https."


def listener_scheme(listener: str) -> str:
    """``http`` or ``https``, the scheme of a ``listeners`` entry; anything else is refused."""
    scheme, sep, _ = listener.partition("://")
    scheme = scheme.strip().lower() if sep else "http"
    if scheme not in ("http", "https"):
        raise ConfigError(
            f"Invalid value {listener} for configuration listeners: the scheme must be http "
            "or https, e.g. https://0.0.0.0:8443"
        )
    return scheme


def _setting(props: Mapping[str, str], name: str) -> str | None:
    for key in (f"{_LISTENER_PREFIX}{name}", name):
        value = props.get(key)
        if value is not None and str(value).strip():
            return str(value).strip()
    return None


@dataclass(frozen=True)
class RestTls:
    """The TLS settings of an ``https`` listener, checked when the worker starts."""

    keystore_location: str | None
    certificate_chain: str | None
    private_key: str | None
    key_password: str | None
    truststore_location: str | None
    client_authentication: str

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> RestTls:
        for store in ("ssl.keystore.type", "ssl.truststore.type"):
            kind = _setting(props, store)
            if kind is not None and kind.upper() != "PEM":
                raise ConfigError(
                    f"Invalid value {kind} for configuration {store}: herder reads PEM files "
                    "only; convert the store with `openssl pkcs12 -nodes` or keytool and set "
                    f"{store}=PEM"
                )
        client_auth = (_setting(props, "ssl.client.authentication") or "none").lower()
        if client_auth not in CLIENT_AUTHENTICATION:
            raise ConfigError(
                f"Invalid value {client_auth} for configuration ssl.client.authentication: "
                "one of none, requested, required"
            )
        tls = cls(
            keystore_location=_setting(props, "ssl.keystore.location"),
            certificate_chain=_setting(props, "ssl.keystore.certificate.chain"),
            private_key=_setting(props, "ssl.keystore.key"),
            key_password=_setting(props, "ssl.key.password"),
            truststore_location=_setting(props, "ssl.truststore.location"),
            client_authentication=client_auth,
        )
        if tls.keystore_location is None and tls.certificate_chain is None:
            raise ConfigError(
                "an https listener needs the worker's certificate and key: set "
                "ssl.keystore.location to a PEM file holding both (or "
                "ssl.keystore.certificate.chain and ssl.keystore.key inline)"
            )
        tls.stores.check()
        if tls.client_authentication != "none" and tls.truststore_location is None:
            raise ConfigError(
                f"ssl.client.authentication={tls.client_authentication} checks clients "
                "against the truststore: set ssl.truststore.location to a PEM file of the "
                "CA certificates that sign them"
            )
        # fail at start-up, naming the setting, rather than at the first connection
        tls.server_context()
        tls.client_context()
        return tls

    @property
    def stores(self) -> PemStores:
        return PemStores(
            keystore_location=self.keystore_location,
            certificate_chain=self.certificate_chain,
            private_key=self.private_key,
            key_password=self.key_password,
            truststore_location=self.truststore_location,
        )

    def server_context(self) -> ssl.SSLContext:
        """What the REST API serves TLS with."""
        return self.stores.server_context(CLIENT_AUTHENTICATION[self.client_authentication])

    def client_context(self) -> ssl.SSLContext:
        """What the worker's requests to other workers use: the truststore (the system's
        CAs when none is set) and the worker's own certificate, for workers that ask."""
        return self.stores.client_context()
