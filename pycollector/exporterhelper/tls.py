"""The ``tls`` section of a client (exporter), with the Go collector's ``configtls`` keys."""

from __future__ import annotations

import dataclasses

import pydantic

from pycollector.component import ComponentConfig, StartError


@dataclasses.dataclass(frozen=True)
class TLSFiles:
    """The PEM contents named by the settings; None where a file was not given."""

    ca: bytes | None
    cert: bytes | None
    key: bytes | None


class ClientTLSSettings(ComponentConfig):
    # gRPC: plaintext instead of TLS. (otlp_http takes TLS from the endpoint's https:// scheme.)
    insecure: bool = False
    # Accept any server certificate; for tests against self-signed servers, never in production.
    insecure_skip_verify: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    # The name the server certificate must carry, when it differs from the endpoint's host.
    server_name_override: str = ""

    @pydantic.model_validator(mode="after")
    def _cert_and_key_together(self) -> "ClientTLSSettings":
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("'cert_file' and 'key_file' are set together (a client certificate needs its key)")
        return self

    def read_files(self) -> TLSFiles:
        """Read the PEM files now, so a missing one stops the start with its key and path."""
        return TLSFiles(*(_read(key, getattr(self, key)) for key in ("ca_file", "cert_file", "key_file")))


def _read(key: str, path: str) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as pem:
            return pem.read()
    except OSError as error:
        raise StartError(f"tls::{key}: cannot read {path}: {error.strerror or error}") from error
