"""TLS contexts from PEM files, for every listener and client in herder.

A *keystore* holds a certificate chain and its private key (one PEM file, or the chain
and the key given inline), a *truststore* the CA certificates to check peers against.
The REST API (Connect's ``ssl.keystore.location`` …), the ensemble's client and quorum
ports (ZooKeeper's ``ssl.keyStore.location`` …) and the clients of both read them
through :class:`PemStores`; each names its settings its own way (:class:`SettingNames`),
so an error names the key the user wrote.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from dataclasses import dataclass, field

from herder.errors import ConfigError

__all__ = ["TLS_RECORD_HANDSHAKE", "PemStores", "SettingNames", "peer_common_name"]

#: the first byte of a TLS connection (a handshake record): how a port that takes both
#: tells TLS from herder's frames, whose first byte is that of a length under 16 MiB
TLS_RECORD_HANDSHAKE = 0x16


@dataclass(frozen=True)
class SettingNames:
    """The configuration keys behind each store, for error messages."""

    keystore: str = "ssl.keystore.location"
    certificate_chain: str = "ssl.keystore.certificate.chain"
    private_key: str = "ssl.keystore.key"
    key_password: str = "ssl.key.password"
    truststore: str = "ssl.truststore.location"
    owner: str = "the worker"


@dataclass(frozen=True)
class PemStores:
    """A keystore and a truststore in PEM form; builds server and client contexts."""

    keystore_location: str | None = None
    certificate_chain: str | None = None
    private_key: str | None = None
    key_password: str | None = None
    truststore_location: str | None = None
    names: SettingNames = field(default_factory=SettingNames)

    @property
    def has_keystore(self) -> bool:
        return self.keystore_location is not None or self.certificate_chain is not None

    def check(self) -> None:
        """Refuse a half-given keystore, naming the settings."""
        if (self.certificate_chain is None) != (self.private_key is None):
            n = self.names
            raise ConfigError(
                f"set both {n.certificate_chain} and {n.private_key}, or neither "
                f"(and {n.keystore} instead)"
            )

    def server_context(self, verify_mode: ssl.VerifyMode = ssl.CERT_NONE) -> ssl.SSLContext:
        """A listener's context: our certificate, and clients checked as ``verify_mode``."""
        if not self.has_keystore:
            raise ConfigError(
                f"a TLS listener needs {self.names.owner}'s certificate and key: set "
                f"{self.names.keystore} to a PEM file holding both"
            )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._load_keystore(context)
        self._load_truststore(context)
        context.verify_mode = verify_mode
        return context

    def client_context(self, *, check_hostname: bool = True) -> ssl.SSLContext:
        """A client's context: the truststore (the system's CAs when none is set) and our
        certificate, if there is one, for servers that ask for it."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = check_hostname
        if self.truststore_location is None:
            context.load_default_certs()
        else:
            self._load_truststore(context)
        if self.has_keystore:
            self._load_keystore(context)
        return context

    def _load_keystore(self, context: ssl.SSLContext) -> None:
        n = self.names
        if self.keystore_location is not None:
            self._load_chain(context, self.keystore_location, n.keystore)
            return
        assert self.certificate_chain is not None and self.private_key is not None
        # ssl reads keys from files only: write the inline PEM to a private temporary file
        fd, path = tempfile.mkstemp(prefix="herder-keystore-", suffix=".pem")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as pem:
                pem.write(_pem(self.private_key) + _pem(self.certificate_chain))
            self._load_chain(context, path, f"{n.certificate_chain} and {n.private_key}")
        finally:
            os.unlink(path)

    def _load_chain(self, context: ssl.SSLContext, path: str, setting: str) -> None:
        try:
            context.load_cert_chain(path, password=self.key_password)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load {self.names.owner}'s certificate and key from {setting} ({path}): "
                f"{exc}; it must be PEM with the certificate chain and the private key (and "
                f"{self.names.key_password} set if the key is encrypted)"
            ) from None

    def _load_truststore(self, context: ssl.SSLContext) -> None:
        if self.truststore_location is None:
            return
        try:
            context.load_verify_locations(cafile=self.truststore_location)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load {self.names.truststore} ({self.truststore_location}): {exc}; "
                "it must be a PEM file of CA certificates"
            ) from None


def peer_common_name(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
    """The common name of the certificate a peer proved it holds, if it showed one."""
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for attribute in rdn:
            if attribute[0] == "commonName":
                return str(attribute[1])
    return None


def _pem(text: str) -> str:
    return text.strip() + "\n"
