"""The ``tls`` section of a client (exporter), with the Go collector's ``configtls`` keys."""

from __future__ import annotations

import dataclasses

import pydantic

from pycollector.component import StartError, only_go_default
from pycollector.config.servers import CertificateAndKey

# (declared here: a call in an annotation reads as a string to linters under `annotations`)
_OnlyGivenCa = only_go_default(False, "with a CA given, only that CA is trusted (without one, the system's)")


@dataclasses.dataclass(frozen=True)
class TLSFiles:
    """The PEM contents named by the settings; None where a file was not given."""

    ca: bytes | None
    cert: bytes | None
    key: bytes | None


class ClientTLSSettings(CertificateAndKey):
    # gRPC: plaintext instead of TLS. (otlp_http takes TLS from the endpoint's https:// scheme.)
    insecure: bool = False
    # Accept any server certificate; for tests against self-signed servers, never in production.
    insecure_skip_verify: bool = False
    # The CA the server's certificate must be signed by, a file or inline PEM (not both).
    ca_file: str = ""
    ca_pem: str = ""
    # The name the server certificate must carry, when it differs from the endpoint's host.
    server_name_override: str = ""
    include_system_ca_certs_pool: _OnlyGivenCa = None

    @pydantic.model_validator(mode="after")
    def _cert_and_key_together(self) -> "ClientTLSSettings":
        if bool(self.cert_file or self.cert_pem) != bool(self.key_file or self.key_pem):
            raise ValueError("'cert_file' and 'key_file' are set together (a client certificate needs its key)")
        return self

    def read_files(self) -> TLSFiles:
        """The PEM contents, read now from their files, so a missing one stops the start with its
        key and path."""
        inline = {"ca_file": self.ca_pem, "cert_file": self.cert_pem, "key_file": self.key_pem.reveal() if self.key_pem else ""}
        return TLSFiles(*(inline[key].encode() if inline[key] else _read(key, getattr(self, key)) for key in ("ca_file", "cert_file", "key_file")))

    def has_inline_pem(self) -> bool:
        return bool(self.ca_pem or self.cert_pem or self.key_pem)


def _read(key: str, path: str) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as pem:
            return pem.read()
    except OSError as error:
        raise StartError(f"tls::{key}: cannot read {path}: {error.strerror or error}") from error
