"""Settings of the flame graph exporter."""

from __future__ import annotations

import pydantic

from pycollector.component import ComponentConfig
from pycollector.config.types import Duration

from pycollector.http_server import Endpoint

DEFAULT_ENDPOINT = "localhost:13900"
DEFAULT_WINDOW = 300.0


class FlamegraphConfig(ComponentConfig):
    # Where the page is served; `localhost` keeps it off the network (stacks name internals).
    endpoint: Endpoint = DEFAULT_ENDPOINT
    # The page shows the samples of this last stretch of time.
    window: Duration = pydantic.Field(DEFAULT_WINDOW, gt=0)
