"""Configuration: load and resolve YAML (``loader``), then check it all against the plugins (``validate``)."""

from pycollector.config.errors import ConfigError
from pycollector.config.loader import load

__all__ = ["ConfigError", "load"]
