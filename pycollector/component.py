"""The component contract: one shape for built-in and third-party plugins.

A plugin publishes a *factory* under one of the entry-point groups in ``KIND_GROUPS``::

    [project.entry-points."pycollector.exporters"]
    my_exporter = "my_package:factory"

The factory says what it is and builds components::

    factory.type          "otlp_grpc"          the name configs use
    factory.aliases       ("otlp",)            deprecated names that still work (logged once)
    factory.signals       {"profiles", ...}    pipelines it may appear in
    factory.stability     "Alpha"              as the Go collector grades components (default Development)
    factory.config_model  a pydantic model: every key, its type, its default, its validation
    factory.create(settings, config, next_consumer) -> component

Lifecycle of a component (the engine guarantees the order):

    start(host)     open sockets, threads, BPF; return quickly; raise StartError with a clear
                    reason when it cannot start.
    consume(data)   processors, exporters and connectors; ``data`` is the OTLP protobuf message
                    itself (ProfilesData, TracesData, MetricsData, LogsData). May raise
                    RefusedError (retryable: the receiver applies backpressure) or
                    PermanentError (the data is bad: dropped and counted).
    shutdown()      safe before start and safe twice; stops background work and flushes what it
                    holds into ``next_consumer``, which is still running at that point.

The engine counts items sent and failed around an exporter's ``consume``; an exporter that queues
(and so only knows later whether a send worked) sets ``reports_sent_items = True`` and counts
``otelcol_exporter_sent_<items>`` / ``..._send_failed_<items>`` itself.

Receivers push into ``next_consumer.consume(data)``; the engine routes each message by its type to
every pipeline the receiver feeds and counts what was accepted or refused on its behalf.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
import unicodedata
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import pydantic
import pydantic_core

if TYPE_CHECKING:
    import structlog

    from pycollector.telemetry import ComponentTelemetry

KINDS = ("receivers", "processors", "exporters", "extensions", "connectors")
KIND_GROUPS = {kind: f"pycollector.{kind}" for kind in KINDS}
SIGNALS = ("traces", "metrics", "logs", "profiles")


class ComponentError(Exception):
    """Base of the errors a component raises on purpose."""


class RefusedError(ComponentError):
    """Retryable: the data was not taken now, try again later (backpressure)."""

    def __init__(self, message: str = "refused", retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(ComponentError):
    """The data can never be accepted (malformed, rejected by the backend): drop and count it."""


class StartError(ComponentError):
    """A component could not start; the message is shown to the user as the reason."""


# The validation context of a config as its user wrote it (``build_plan``), as against the
# defaults a factory builds. Go's Validate() refuses some default configs (an exporter with no
# endpoint, a resource processor with no action): those rules hold for what is written (see
# ``required_as_written``, ``as_written``), and the defaults stay buildable (print-config, tests).
AS_WRITTEN = {"as_written": True}
_EMPTY = (None, "", [], {})


class ComponentConfig(pydantic.BaseModel):
    """Base for every component config model: unknown keys are errors, defaults are explicit.

    ``required_as_written``: keys a config must give (non-empty) where Go's component requires
    them, though the model has a default; a tuple among them means one of those keys."""

    model_config = pydantic.ConfigDict(extra="forbid")
    required_as_written: ClassVar[tuple[str | tuple[str, ...], ...]] = ()

    @pydantic.model_validator(mode="before")
    @classmethod
    def _as_go_decodes(cls, data: Any) -> Any:
        """Strings as Go's config decoding reads them: where a list is expected, a string is its
        comma-separated items (``detectors: env,system``); where a boolean or an integer is, a
        quoted one ("true", "5") is refused, as Go converts no quoted scalar."""
        if not isinstance(data, dict):
            return data
        changed = {}
        for name, field in cls.model_fields.items():
            key = field.alias or name
            value = data.get(key)
            if not isinstance(value, str):
                continue
            if _is_list(field.annotation):
                changed[key] = [item.strip() for item in value.split(",")]
            elif _is_scalar(field.annotation, (bool, int)):
                changed[key] = _Quoted(value)  # (fails the field's own check, naming the key)
        return {**data, **changed} if changed else data

    @pydantic.model_validator(mode="wrap")
    @classmethod
    def _required_as_written(cls, data: Any, handler: Any, info: pydantic.ValidationInfo) -> Any:
        if cls.required_as_written and as_written(info) and isinstance(data, dict):
            missing = []
            for required in cls.required_as_written:
                keys = (required,) if isinstance(required, str) else required
                if all(data.get(key) in _EMPTY for key in keys):
                    missing.append({"type": "missing", "loc": (keys[0],), "input": data})
            if missing:
                raise pydantic_core.ValidationError.from_exception_data(cls.__name__, missing)
        return handler(data)


class _Quoted:
    """A quoted scalar where Go wants a boolean or a number: no type takes it."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        looks_typed = self.text.strip().lower() in ("true", "false") or self.text.strip().lstrip("+-").isdigit()
        return f"{self.text!r} (quoted: write it without quotes)" if looks_typed else repr(self.text)


def _is_scalar(annotation: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a field's type is exactly one of ``kinds`` (or one of them or None)."""
    if annotation in kinds:
        return True
    members = [member for member in typing.get_args(annotation) if member is not type(None)]
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(members) == 1 and members[0] in kinds


def _is_list(annotation: Any) -> bool:
    """Whether a field's type is a list (or a list or None)."""
    if typing.get_origin(annotation) is list:
        return True
    return any(typing.get_origin(member) is list for member in typing.get_args(annotation))


def as_written(info: pydantic.ValidationInfo) -> bool:
    return bool(info.context) and bool(info.context.get("as_written"))


def only_go_default(default: Any, reason: str, normalize: Any = None) -> Any:
    """A Go key whose default (off, none, zero) is what this component does: that value is
    accepted, as it acts as in Go; any other is refused by name. ``normalize`` reads the written
    value first (a duration's text)."""

    def check(value: Any) -> Any:
        read = normalize(value) if normalize is not None and value is not None else value
        if value is not None and read != default:
            raise ValueError(f"not supported by pycollector: {reason} (only {default!r} is)")
        return value

    return typing.Annotated[Any, pydantic.BeforeValidator(check), pydantic.Field(default=None, exclude=True)]


def optional_section(value: Any) -> Any:
    """Go's optional sections (configoptional): written at all, even empty, means on, and
    ``enabled: false`` inside turns the section off. For a ``mode="before"`` field validator."""
    if value is None:
        return {}
    if isinstance(value, dict) and "enabled" in value:
        enabled = value["enabled"]
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled: expected true or false, got {enabled!r}")
        return {key: item for key, item in value.items() if key != "enabled"} if enabled else None
    return value


_Section = typing.TypeVar("_Section")
# A Go optional section of type T (``tls: OptionalSection[ServerTLSSettings] = None``): written,
# even empty, means on; ``enabled: false`` inside means off; absent, the field's default.
OptionalSection = typing.Annotated[typing.Optional[_Section], pydantic.BeforeValidator(optional_section)]


def not_supported(reason: str) -> Any:
    """A key the Go component has and this one does not act on: absent is fine, written is an
    error naming it (``exporters::x::key: not supported by pycollector: <reason>``), never a key
    accepted and ignored. Left out of dumps."""

    def refuse(value: Any) -> Any:
        raise ValueError(f"not supported by pycollector: {reason}")

    return typing.Annotated[Any, pydantic.BeforeValidator(refuse), pydantic.Field(default=None, exclude=True)]


@dataclasses.dataclass(frozen=True)
class ComponentID:
    """``type[/name]`` as written in the config."""

    type: str
    name: str = ""

    @classmethod
    def parse(cls, text: str) -> "ComponentID":
        type_, _, name = str(text).partition("/")
        return cls(type_.strip(), name.strip())

    def __str__(self) -> str:
        return f"{self.type}/{self.name}" if self.name else self.type

    @classmethod
    def checked(cls, text: str) -> "ComponentID":
        """``text`` as an id, checked as Go checks one where a config names a component (an
        extension's id in ``auth::authenticator``): ValueError with Go's words otherwise."""
        if not text:
            raise ValueError("id must not be empty")
        type_, slash, name = text.partition("/")
        if not _ID_TYPE.fullmatch(type_):
            raise ValueError(f'in "{text}" id: invalid character(s) in type "{type_}"')
        if slash and not name:
            raise ValueError(f'in "{text}" id: the part after / should not be empty')
        # Go's name pattern: no separator, control or symbol characters (\pZ \pC \pS).
        if slash and any(unicodedata.category(character)[0] in "ZCS" for character in name):
            raise ValueError(f'in "{text}" id: invalid character(s) in name "{name}"')
        return cls(type_, name)


_ID_TYPE = re.compile(r"[a-zA-Z][0-9a-zA-Z_]{0,62}")


@dataclasses.dataclass(frozen=True)
class WorkerSlot:
    """Which of the collector's worker processes this is: ``index`` of ``count`` (a gateway runs one
    per core, each with its own pipelines, sharing the listening sockets; pycollector.workers)."""

    index: int = 0
    count: int = 1

    @property
    def shared(self) -> bool:
        """True when other worker processes run the same components beside this one: listeners
        share their port (SO_REUSEPORT), files and limits that were the process's are split."""
        return self.count > 1


SOLE_WORKER = WorkerSlot()

# Where a multi-worker collector runs an extension (Factory.placement).
EACH_WORKER = "each_worker"  # one in every worker (auth, storage: the pipelines there use it)
FIRST_WORKER = "first_worker"  # only in worker 0 (pprof: a profile of one worker of several)
SUPERVISOR = "supervisor"  # once, in the supervising process (health_check: one answer for all)


@dataclasses.dataclass
class Settings:
    """What the engine hands every component: who it is, where to log, what to count, and which
    worker process it runs in."""

    id: ComponentID
    kind: str  # one of KINDS
    logger: "structlog.typing.FilteringBoundLogger"
    telemetry: "ComponentTelemetry"
    worker: WorkerSlot = SOLE_WORKER


@runtime_checkable
class Consumer(Protocol):
    def consume(self, data: Any) -> None: ...


class Component:
    """Convenience base: no-op lifecycle. Subclasses override what they need."""

    def start(self, host: "Host") -> None:
        pass

    def consume(self, data: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not consume data")

    def shutdown(self) -> None:
        pass


class Host(Protocol):
    """What a started component may ask of the running service."""

    def get_extension(self, component_id: str) -> Any: ...

    def report_fatal_error(self, source: str, error: BaseException) -> None: ...

    def report_status(self, source: str, status: str, error: BaseException | None = None) -> None:
        """A running component says how it is (``pycollector.service.Status``), e.g. an exporter
        whose backend went away reports ``recoverable_error`` and ``ok`` when it is back."""


class Factory:
    """Base class for factories. Subclasses set the class attributes and implement ``create``.

    ``mutates_data``: a processor that edits the message in place says so, and the engine hands it
    its own copy when a receiver fans out to several pipelines.

    ``takes_serialized_profiles``: a component that only passes profiles on, counts or appends them
    takes ``pycollector.pdata.serialized.SerializedProfiles`` as well as messages, and is handed the
    bytes a receiver got without a message being built; any other is handed a message.
    """

    type: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    signals: ClassVar[frozenset[str]] = frozenset(SIGNALS)
    # As the Go collector grades components (`pycollector components` prints it): Development,
    # Alpha, Beta, Stable, Deprecated, Unmaintained.
    stability: ClassVar[str] = "Development"
    config_model: ClassVar[type[pydantic.BaseModel]] = ComponentConfig
    mutates_data: ClassVar[bool] = False
    takes_serialized_profiles: ClassVar[bool] = False
    # Extensions: where a collector of several worker processes runs it (EACH_WORKER, FIRST_WORKER,
    # SUPERVISOR).
    placement: ClassVar[str] = EACH_WORKER

    def default_config(self) -> pydantic.BaseModel:
        return self.config_model()

    def why_not_in_workers(self, config: Any) -> str | None:
        """Receivers: None when several worker processes can each run one with ``config`` side by
        side (each serving its share of the connections to the same ports), else why not. By
        default a receiver runs once per collector: a second copy of a scraper or a profiler would
        collect everything twice."""
        return "it runs once per collector (several copies would each collect the same data)"

    def create(self, settings: Settings, config: Any, next_consumer: Consumer | None) -> Component:
        raise NotImplementedError
