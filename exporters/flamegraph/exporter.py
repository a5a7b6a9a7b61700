"""The flame graph exporter: keeps the last ``window`` of samples that flow through it and
serves them on ``endpoint`` as an interactive flame graph, one sample type at a time (CPU samples,
off-CPU time, ...: the page has a selector).

It is an exporter that serves, as the Go collector's prometheus exporter is: the data reaches it
through the pipeline like any exporter's, and one config entry is all it takes.

    /                  the page, with the current window inlined; it refreshes from data.json
    /data.json         the current window, per sample type and process (see tree.py)
    /flamegraph.html   the page as a file to save and share (no server needed to open it);
                       ?fragment= the view it opens on (the page's own link passes its URL fragment)
"""

from __future__ import annotations

import datetime
import json
import socket

from pycollector.component import Component, StartError
from pycollector.config.types import format_duration

from exporters.flamegraph.config import FlamegraphConfig
from exporters.flamegraph.page import PageTemplate, RendererMissing
from exporters.flamegraph.tree import page_data
from exporters.flamegraph.window import ProfileWindow
from pycollector.http_server import HttpEndpoint, Response

HTML = "text/html; charset=utf-8"
MAX_FRAGMENT = 2000  # characters of the view a saved file opens on (a search typed, a span id...)


class FlamegraphExporter(Component):
    def __init__(self, settings, config: FlamegraphConfig):
        self.log = settings.logger
        self.config = config
        self.window = ProfileWindow(config.window)
        self.host_name = socket.gethostname()
        self._server = HttpEndpoint(config.endpoint, self._answer, thread_name="flamegraph-http", query=True)
        self._template: PageTemplate | None = None
        self.url: str | None = None

    def start(self, host) -> None:
        try:
            self._template = PageTemplate()
        except RendererMissing as error:
            raise StartError(str(error)) from error
        self.url = self._server.start() + "/"
        self.log.info("serving the flame graph of recent samples", url=self.url, window=format_duration(self.config.window))

    def consume(self, data) -> None:
        self.window.add(data)

    def shutdown(self) -> None:
        self._server.stop()

    def _answer(self, path: str, query: dict[str, str]) -> Response:
        if path in ("/", "/index.html"):
            return Response(200, self._template.render(self._data(), live=True), HTML)
        if path == "/data.json":
            return Response(200, json.dumps(self._data(), separators=(",", ":")).encode())
        if path == "/flamegraph.html":
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            attachment = f'attachment; filename="flamegraph-{self.host_name}-{stamp}.html"'
            data = {**self._data(), "fragment": query.get("fragment", "")[:MAX_FRAGMENT]}
            return Response(200, self._template.render(data, live=False), HTML, {"Content-Disposition": attachment})
        return Response(404, b'{"error":"not found; the flame graph is at /"}')

    def _data(self) -> dict:
        return page_data(self.window.totals(), self.config.window, self.host_name, self.window.spans_cut,
                         self.window.segments(), self.window.resources())
