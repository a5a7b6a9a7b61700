"""Request bodies -> the pipeline's messages; profiles from whichever profiles.proto layout the
sender wrote, recognized from the bytes unless the config names it."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from pycollector.logs import log_once
from pycollector.otlp import Encoding, OtlpSignal, profiles_wire
from pycollector.pdata.serialized import SerializedProfiles

AUTO = "auto"


class RequestDecoder:
    def __init__(self, receiver_id: str, profiles_wire_version: str, logger: Any):
        self._id = receiver_id
        self._layout = None if profiles_wire_version == AUTO else profiles_wire.LAYOUTS[profiles_wire_version]
        self.log = logger

    def decode(self, otlp: OtlpSignal, body: bytes, encoding: Encoding) -> Message | SerializedProfiles:
        """ValueError saying why when the body cannot be read, a layout it is in none of among them.

        Profiles of a protobuf body go on as their bytes (``SerializedProfiles``), checked as
        protobuf's parser would check them: a gateway's batch and exporter never build a message."""
        if otlp.signal != "profiles":
            return encoding.decode(body, otlp.data_type)
        decoded = profiles_wire.decode(body, encoding.name, otlp.data_type, self._layout)
        if decoded.layout != profiles_wire.CURRENT:
            log_once(
                self.log,
                (self._id, "profiles layout", decoded.layout.version, encoding.name),
                "info",
                f"a sender writes profiles in the profiles.proto v{decoded.layout.version} layout; "
                f"they are read as such and carried on as v{profiles_wire.CURRENT.version}",
                encoding=encoding.name,
            )
        if decoded.dropped:
            log_once(
                self.log,
                (self._id, "profiles dropped fields"),
                "warning",
                f"profile comments and aggregation temporalities of v{decoded.layout.version} have no field "
                f"in v{profiles_wire.CURRENT.version}: left out (samples are all kept)",
                comments=decoded.dropped.profile_comments,
                aggregation_temporalities=decoded.dropped.aggregation_temporalities,
            )
        return decoded.message
