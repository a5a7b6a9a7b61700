"""The flame graph page as one self-contained HTML document.

Everything is inlined: d3 and d3-flame-graph (fetched at setup by npm into ``vendor/``, see
scripts/setup.sh, and shipped in the wheel as package data when present at build time), the page's
own script and style, and the data. So the page served live and the file saved for sharing are the
same document; the saved one simply has no server to refresh from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ASSETS = HERE / "assets"
VENDOR = HERE / "vendor"
# The renderer's files, as scripts/setup.sh installs them.
VENDOR_FILES = {"/*D3*/": "d3.min.js", "/*D3_FLAMEGRAPH*/": "d3-flamegraph.umd.min.js"}
ASSET_FILES = {"/*UNITS_JS*/": "units.js", "/*COMPARE_JS*/": "compare.js", "/*PAGE_JS*/": "page.js", "/*PAGE_CSS*/": "page.css"}


class RendererMissing(Exception):
    """The vendored renderer is not installed."""


def missing_vendor_files() -> list[str]:
    return [name for name in VENDOR_FILES.values() if not (VENDOR / name).is_file()]


class PageTemplate:
    """The page with its scripts inlined once; ``render`` adds the data of each request."""

    def __init__(self) -> None:
        missing = missing_vendor_files()
        if missing:
            raise RendererMissing(
                f"the flame graph renderer is not installed ({', '.join(missing)} missing in {VENDOR}): "
                "in a source checkout run scripts/setup.sh, which fetches d3 and d3-flame-graph with npm; "
                "a wheel carries them only when it was built from a checkout where scripts/setup.sh had run, "
                "so rebuild it there (or leave the flamegraph exporter out of the config)"
            )
        page = (ASSETS / "page.html").read_text()
        for marker, name in VENDOR_FILES.items():
            page = page.replace(marker, _script_safe((VENDOR / name).read_text()))
        for marker, name in ASSET_FILES.items():
            page = page.replace(marker, _script_safe((ASSETS / name).read_text()))
        self._page = page

    def render(self, data: dict[str, Any], live: bool) -> bytes:
        # "<" escaped, so no string in the data (a function name, a path) can close the script tag.
        document = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
        page = self._page.replace("/*LIVE*/", "true" if live else "false", 1)
        return page.replace("/*DATA*/", document, 1).encode()


def _script_safe(source: str) -> str:
    """Inline script text must not contain a closing script tag; the escaped form means the same
    inside a JavaScript string or regex, where such text can only be."""
    return source.replace("</script", "<\\/script")
