"""Turn ``--config`` files (or URIs: ``env:``, ``yaml:``, ``http(s)://``, see ``providers``) and
``--set`` flags into one plain dict, with ``${...}`` references resolved.

Order, as in the Go collector: files deep-merged in the order given (later wins, lists are
replaced), then ``--set`` values, then expansion of ``${env:VAR}``, ``${env:VAR:-default}``,
``${VAR}``, ``${file:path}`` and the ``$$`` escape in every string value.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable

import yaml

from pycollector.config.errors import ConfigError, join_path
from pycollector.config.providers import SourceError, nest_delimited_keys, read_source

# ${scheme:rest} or ${NAME}; `$$` is a literal dollar.
_REFERENCE = re.compile(r"\$\$|\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Values a document may hold once its aliases are expanded: a few aliases that repeat each other
# make billions of them (the "billion laughs"), as the Go collector's YAML library also refuses.
MAX_VALUES = 100_000
# Flow collections ([...], {...}) nested in one another. PyYAML scans them in time quadratic in
# their depth (half a second for 4,000 brackets) before it runs out of Python's stack at ~500.
MAX_FLOW_DEPTH = 64


def load(paths: list[str], sets: list[str] = (), env: dict[str, str] | None = None, warn: Callable[[str], None] | None = None) -> dict:
    """Load, merge, override and expand. Raises ConfigError listing every problem found."""
    problems: list[str] = []
    merged: dict = {}
    for path in paths:
        document = _read_yaml(path, problems, env)
        if document is not None:
            merged = deep_merge(merged, document)
    for assignment in sets:
        _apply_set(merged, assignment, problems)
    if problems:
        raise ConfigError(problems)
    resolver = _Resolver(os.environ if env is None else env, warn or (lambda message: None), problems)
    expanded = resolver.expand_tree(merged, ())
    if problems:
        raise ConfigError(problems)
    return expanded


def deep_merge(base: Any, override: Any) -> Any:
    """Maps merge key by key; anything else (lists included) is replaced by the later value."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = deep_merge(base[key], value) if key in base else value
        return merged
    return override


def _read_yaml(uri: str, problems: list[str], env: dict[str, str] | None = None) -> dict | None:
    """A ``--config``'s document: a file, or wherever its URI says (``providers``), with keys
    written ``a::b`` nested as Go nests them."""
    try:
        path, raw = read_source(uri, env)
    except SourceError as error:
        problems.append(str(error))
        return None
    try:
        document = _parse(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        problems.append(f"{path}:{line}: the config file is not UTF-8 text (byte {error.start}: {error.reason})")
        return None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        problems.append(f"{where}: invalid YAML: {getattr(error, 'problem', None) or error}")
        return None
    if document is None:
        return {}
    if not isinstance(document, dict):
        problems.append(f"{path}: the top level must be a map of sections (receivers, exporters, service...), got {type(document).__name__}")
        return None
    return nest_delimited_keys(document)


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses flow collections nested more than ``MAX_FLOW_DEPTH`` deep."""

    def fetch_flow_collection_start(self, TokenClass) -> None:
        if self.flow_level >= MAX_FLOW_DEPTH:
            raise yaml.scanner.ScannerError(None, None, f"[...] and {{...}} nested more than {MAX_FLOW_DEPTH} deep", self.get_mark())
        super().fetch_flow_collection_start(TokenClass)


def _parse(text: str) -> Any:
    """``yaml.safe_load``, raising only YAMLError. PyYAML's constructors raise others for a value
    they cannot build (ValueError for the date 2001-13-45 or ``!!int abc``, AttributeError for
    ``!!timestamp abc``, IndexError for ``!!float ""``), and its parser RecursionError for a
    document nested a few hundred deep."""
    try:
        document = yaml.load(text, Loader=_Loader)  # a SafeLoader: plain data only
    except yaml.YAMLError:
        raise
    except RecursionError:
        raise yaml.YAMLError("it is nested too deeply") from None
    except (ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError) as error:
        raise yaml.YAMLError(f"a value cannot be read: {error}") from None
    if _values_over(document, MAX_VALUES):
        raise yaml.YAMLError(f"it holds more than {MAX_VALUES} values once its aliases are expanded")
    return document


def _values_over(document: Any, limit: int) -> bool:
    """Whether ``document``, aliases expanded, holds more than ``limit`` values; stops there."""
    pending, count = [document], 0
    while pending:
        node = pending.pop()
        count += 1
        if count > limit:
            return True
        if isinstance(node, dict):
            pending += node.values()
        elif isinstance(node, list):
            pending += node
    return False


def _apply_set(config: dict, assignment: str, problems: list[str]) -> None:
    """``--set a.b.c=value`` or the Go collector's ``--set a::b::c=value``; the value is YAML."""
    key, separator, raw_value = assignment.partition("=")
    if not separator or not key:
        problems.append(f"--set {assignment}: expected key=value, e.g. --set exporters::debug::verbosity=detailed")
        return
    # `::` is the Go collector's delimiter; it also keeps a dot in a component name intact.
    parts = key.split("::") if "::" in key else key.split(".")
    try:
        value = _parse(raw_value) if raw_value else ""
    except yaml.YAMLError:
        value = raw_value
    node = config
    for index, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            # The key only: the value may be a secret.
            problems.append(f"--set {key}=...: {join_path(*parts[: index + 1])} is not a map")
            return
        node = child
    node[parts[-1]] = value


class _Resolver:
    def __init__(self, env: dict[str, str], warn: Callable[[str], None], problems: list[str]):
        self.env, self.warn, self.problems = env, warn, problems

    def expand_tree(self, node: Any, path: tuple) -> Any:
        if isinstance(node, dict):
            return {key: self.expand_tree(value, (*path, key)) for key, value in node.items()}
        if isinstance(node, list):
            return [self.expand_tree(value, (*path, index)) for index, value in enumerate(node)]
        if isinstance(node, str):
            return self.expand_string(node, join_path(*path))
        return node

    def expand_string(self, text: str, where: str) -> Any:
        whole = _REFERENCE.fullmatch(text)
        if whole and whole.group(0) != "$$":
            # A value that is exactly one reference takes the referenced value's YAML type, so
            # `port: ${env:PORT}` gives an int.
            return _typed(self.resolve(whole.group(1), where))
        return _REFERENCE.sub(lambda match: "$" if match.group(0) == "$$" else self.resolve(match.group(1), where), text)

    def resolve(self, reference: str, where: str) -> str:
        scheme, colon, rest = reference.partition(":")
        if not colon:
            scheme, rest = "env", reference
        if scheme == "env":
            name, default_marker, default = rest.partition(":-")
            if not _ENV_NAME.match(name):
                self.problems.append(f"{where}: invalid environment variable name '{name}' in '${{{reference}}}'")
                return ""
            value = self.env.get(name)
            if value is None or (value == "" and default_marker):
                if default_marker:
                    return default
                self.warn(f"{where}: environment variable {name} is not set; using an empty value")
                return ""
            return value
        if scheme == "file":
            try:
                with open(os.path.expanduser(rest), "rb") as stream:
                    raw = stream.read()
                return raw.decode("utf-8").rstrip("\n")
            except OSError as error:
                self.problems.append(f"{where}: cannot read '${{{reference}}}': {error.strerror}")
            except UnicodeDecodeError as error:
                self.problems.append(f"{where}: '${{{reference}}}' is not UTF-8 text (byte {error.start}: {error.reason})")
            except ValueError:  # open() refuses a path with a NUL character, which YAML's "\0" writes
                self.problems.append(f"{where}: cannot read '${{{reference}}}': the path holds a NUL character")
            return ""
        self.problems.append(f"{where}: unsupported reference scheme '{scheme}' in '${{{reference}}}' (supported: env, file)")
        return ""


def _typed(value: str) -> Any:
    try:
        parsed = _parse(value)
    except yaml.YAMLError:
        return value
    # Only scalars take a type; a value that looks like YAML structure stays a string.
    return parsed if isinstance(parsed, (int, float, bool)) and not isinstance(parsed, type(None)) else value
