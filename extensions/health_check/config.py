"""Settings of the health_check extension, with the Go extension's keys and defaults."""

from __future__ import annotations

import pydantic

from pycollector.component import ComponentConfig

from pycollector.http_server import Endpoint

DEFAULT_ENDPOINT = "localhost:13133"
DEFAULT_PATH = "/"


class HealthCheckConfig(ComponentConfig):
    endpoint: Endpoint = DEFAULT_ENDPOINT
    # The URL path that answers; any other path is 404.
    path: str = DEFAULT_PATH

    @pydantic.field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        return value if value.startswith("/") else "/" + value
