"""An ensemble server's TLS and authentication settings, with ZooKeeper's names.

* ``secureClientPort`` serves clients over TLS with ``ssl.keyStore.location`` (a PEM file
  with the server's certificate chain and key, ``ssl.keyStore.password`` if the key is
  encrypted) and checks client certificates against ``ssl.trustStore.location`` as
  ``ssl.clientAuth`` says (``none``, ``want``, ``need``; ZooKeeper's default ``need``).
  ``client.portUnification=true`` lets that port take plaintext clients too.
* ``sslQuorum=true`` puts the quorum and election ports on TLS with
  ``ssl.quorum.keyStore.location`` and ``ssl.quorum.trustStore.location``; both ends
  present a certificate and check the other's, so a server without one the quorum's
  truststore verifies cannot join (``ssl.quorum.hostnameVerification``, default true,
  also checks the certificate names the address in the ``server.N`` line).
* ``enforce.auth.enabled=true`` refuses every request of a client that has not
  authenticated by one of ``enforce.auth.schemes`` (``sasl``: a user of
  ``sasl.users.file``; ``x509``: a client certificate, its common name the principal);
  ``anonymous.access=read`` lets unauthenticated clients read instead. Users have the
  ``read`` or ``write`` role; certificate principals write if ``x509.writers`` names them.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from herder.config import ConfigDef, Importance, Range, Type
from herder.errors import ConfigError
from herder.wire.auth import SCHEMES, AccessPolicy, ClientSecurity
from herder.wire.tls import PemStores, SettingNames

#: ``ssl.clientAuth``: whether clients must present a certificate
CLIENT_AUTH = {"none": ssl.CERT_NONE, "want": ssl.CERT_OPTIONAL, "need": ssl.CERT_REQUIRED}


def define_security(config: ConfigDef) -> ConfigDef:
    """Add the security keys to an ensemble server's ConfigDef."""
    return (
        config.define(
            "secureClientPort",
            Type.INT,
            default=-1,
            validator=Range.between(-1, 65535),
            importance=Importance.HIGH,
            documentation="Port for TLS client connections (-1: none; 0 picks a free one).",
        )
        .define(
            "secureClientPortAddress",
            Type.STRING,
            default="",
            importance=Importance.MEDIUM,
            documentation="Address the secure client port binds to (default clientPortAddress).",
        )
        .define(
            "client.portUnification",
            Type.BOOLEAN,
            default=False,
            importance=Importance.LOW,
            documentation="Whether the secure client port takes plaintext clients too.",
        )
        .define("ssl.keyStore.location", Type.STRING, default="", importance=Importance.HIGH,
                documentation="PEM file with the server's certificate chain and private key.")
        .define("ssl.keyStore.password", Type.PASSWORD, default=None, importance=Importance.MEDIUM,
                documentation="Password of the keystore's private key, if it is encrypted.")
        .define("ssl.keyStore.type", Type.STRING, default="PEM", importance=Importance.LOW,
                documentation="PEM: the only type herder reads.")
        .define("ssl.trustStore.location", Type.STRING, default="", importance=Importance.HIGH,
                documentation="PEM file of the CAs client certificates are checked against.")
        .define("ssl.trustStore.type", Type.STRING, default="PEM", importance=Importance.LOW,
                documentation="PEM: the only type herder reads.")
        .define("ssl.clientAuth", Type.STRING, default="need", importance=Importance.MEDIUM,
                documentation="Client certificates on the secure port: none, want or need.")
        .define("sslQuorum", Type.BOOLEAN, default=False, importance=Importance.HIGH,
                documentation="TLS, with certificates both ways, on the quorum and election ports.")
        .define("ssl.quorum.keyStore.location", Type.STRING, default="", importance=Importance.HIGH,
                documentation="PEM file with the certificate and key this server shows its peers.")
        .define("ssl.quorum.keyStore.password", Type.PASSWORD, default=None,
                importance=Importance.MEDIUM, documentation="Password of that private key.")
        .define("ssl.quorum.keyStore.type", Type.STRING, default="PEM", importance=Importance.LOW,
                documentation="PEM: the only type herder reads.")
        .define("ssl.quorum.trustStore.location", Type.STRING, default="",
                importance=Importance.HIGH,
                documentation="PEM file of the CAs peers' certificates are checked against.")
        .define("ssl.quorum.trustStore.type", Type.STRING, default="PEM", importance=Importance.LOW,
                documentation="PEM: the only type herder reads.")
        .define("ssl.quorum.hostnameVerification", Type.BOOLEAN, default=True,
                importance=Importance.LOW,
                documentation="Whether a peer's certificate must name its server.N address.")
        .define("enforce.auth.enabled", Type.BOOLEAN, default=False, importance=Importance.HIGH,
                documentation="Refuse clients that have not authenticated.")
        .define("enforce.auth.schemes", Type.LIST, default="sasl", importance=Importance.MEDIUM,
                documentation="How clients may authenticate: sasl (users), x509 (certificate).")
        .define("sasl.users.file", Type.STRING, default="", importance=Importance.HIGH,
                documentation="File of 'user: password, role' lines (roles read and write).")
        .define("x509.writers", Type.LIST, default="", importance=Importance.MEDIUM,
                documentation="Certificate common names that may write (others may read).")
        .define("anonymous.access", Type.STRING, default="", importance=Importance.MEDIUM,
                documentation=(
                    "What unauthenticated clients may do: none, read or write (default write,"
                    " none with enforce.auth.enabled)."
                ))
    )  # fmt: skip


@dataclass(frozen=True)
class EnsembleSecurity:
    """The checked security settings of one server."""

    #: the secure client port, if there is one, and its address
    secure_client_port: int | None = None
    secure_client_address: str = "0.0.0.0"
    port_unification: bool = False
    client_stores: PemStores | None = None
    client_auth: str = "need"
    quorum_stores: PemStores | None = None
    quorum_hostname_verification: bool = True
    access: AccessPolicy | None = None

    def client_context(self) -> ssl.SSLContext | None:
        """What the secure client port serves TLS with."""
        if self.client_stores is None:
            return None
        return self.client_stores.server_context(CLIENT_AUTH[self.client_auth])

    def quorum_contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
        """(listening, connecting) contexts of the quorum and election ports, if on TLS."""
        if self.quorum_stores is None:
            return None
        return (
            self.quorum_stores.server_context(ssl.CERT_REQUIRED),
            self.quorum_stores.client_context(check_hostname=self.quorum_hostname_verification),
        )

    @classmethod
    def from_values(cls, values: Mapping[str, Any], client_address: str) -> EnsembleSecurity:
        for key in (
            "ssl.keyStore.type",
            "ssl.trustStore.type",
            "ssl.quorum.keyStore.type",
            "ssl.quorum.trustStore.type",
        ):
            if str(values[key]).upper() != "PEM":
                raise ConfigError(
                    f"Invalid value {values[key]} for configuration {key}: herder reads PEM "
                    "files only; convert the store with `openssl pkcs12 -nodes` or keytool and "
                    f"set {key}=PEM"
                )
        secure_port = values["secureClientPort"]
        client_auth = str(values["ssl.clientAuth"]).lower()
        if client_auth not in CLIENT_AUTH:
            raise ConfigError(
                f"Invalid value {client_auth} for configuration ssl.clientAuth: one of none, "
                "want, need"
            )
        client_stores = None
        if secure_port >= 0:
            client_stores = _stores(values, "ssl", "the server")
            if not values["ssl.keyStore.location"]:
                raise ConfigError(
                    "secureClientPort needs the server's certificate and key: set "
                    "ssl.keyStore.location to a PEM file holding both"
                )
            if client_auth != "none" and not values["ssl.trustStore.location"]:
                raise ConfigError(
                    f"ssl.clientAuth={client_auth} checks client certificates against the "
                    "truststore: set ssl.trustStore.location (or ssl.clientAuth=none)"
                )
        quorum_stores = None
        if values["sslQuorum"]:
            quorum_stores = _stores(values, "ssl.quorum", "the server")
            if not (
                values["ssl.quorum.keyStore.location"] and values["ssl.quorum.trustStore.location"]
            ):
                raise ConfigError(
                    "sslQuorum=true needs ssl.quorum.keyStore.location (this server's "
                    "certificate and key) and ssl.quorum.trustStore.location (the CA that "
                    "signs every server's certificate)"
                )
        schemes = [s.strip().lower() for s in values["enforce.auth.schemes"] if s.strip()]
        unknown = sorted(set(schemes) - SCHEMES)
        if unknown:
            raise ConfigError(
                f"Invalid value {','.join(unknown)} for configuration enforce.auth.schemes: "
                "the schemes are sasl and x509"
            )
        access = None
        if (
            values["enforce.auth.enabled"]
            or values["sasl.users.file"]
            or values["anonymous.access"]
            or "x509" in schemes
        ):
            if "x509" in schemes and client_stores is None:
                raise ConfigError(
                    "enforce.auth.schemes names x509, which needs client certificates: set "
                    "secureClientPort, ssl.keyStore.location and ssl.trustStore.location"
                )
            access = AccessPolicy.build(
                enforce=values["enforce.auth.enabled"],
                schemes=schemes,
                users_file=values["sasl.users.file"] or None,
                x509_writers=values["x509.writers"],
                anonymous_access=values["anonymous.access"] or None,
            )
        security = cls(
            secure_client_port=secure_port if secure_port >= 0 else None,
            secure_client_address=values["secureClientPortAddress"] or client_address,
            port_unification=values["client.portUnification"],
            client_stores=client_stores,
            client_auth=client_auth,
            quorum_stores=quorum_stores,
            quorum_hostname_verification=values["ssl.quorum.hostnameVerification"],
            access=access,
        )
        # fail at start-up, naming the setting, rather than at the first connection
        security.client_context()
        security.quorum_contexts()
        return security


def _stores(values: Mapping[str, Any], prefix: str, owner: str) -> PemStores:
    password = values[f"{prefix}.keyStore.password"]
    return PemStores(
        keystore_location=values[f"{prefix}.keyStore.location"] or None,
        key_password=password.value if password is not None else None,
        truststore_location=values[f"{prefix}.trustStore.location"] or None,
        names=SettingNames(
            keystore=f"{prefix}.keyStore.location",
            key_password=f"{prefix}.keyStore.password",
            truststore=f"{prefix}.trustStore.location",
            owner=owner,
        ),
    )


#: Kafka's ``security.protocol`` values, for a client's ``ensemble.security.protocol``
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def client_security(
    protocol: str,
    *,
    truststore: str | None = None,
    keystore: str | None = None,
    key_password: str | None = None,
    username: str | None = None,
    password: str | None = None,
    check_hostname: bool = True,
    names: SettingNames | None = None,
    protocol_setting: str = "ensemble.security.protocol",
    user_setting: str = "ensemble.sasl.username",
) -> ClientSecurity | None:
    """How a client reaches the ensemble, from Kafka's client settings (checked); None
    for plain, anonymous connections."""
    protocol = protocol.strip().upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(
            f"Invalid value {protocol} for configuration {protocol_setting}: one of "
            f"{', '.join(SECURITY_PROTOCOLS)}"
        )
    if protocol == "PLAINTEXT":
        return None
    context = None
    if protocol.endswith("SSL"):
        stores = PemStores(
            keystore_location=keystore or None,
            key_password=key_password,
            truststore_location=truststore or None,
            names=names or SettingNames(owner="the client"),
        )
        context = stores.client_context(check_hostname=check_hostname)
    if protocol.startswith("SASL"):
        if not username:
            raise ConfigError(
                f"{protocol_setting}={protocol} authenticates with a user: set {user_setting} "
                "and its password"
            )
        return ClientSecurity(context, username, password or "")
    return ClientSecurity(context)
