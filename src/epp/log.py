"""Logging: structlog configured once from the flags; request fields ride on contextvars."""

from __future__ import annotations

import logging
import sys
from typing import Any, Final, Protocol, TextIO

import orjson
import structlog
from structlog.contextvars import bind_contextvars, bound_contextvars, clear_contextvars
from structlog.typing import EventDict, Processor

__all__ = [
    "DEBUG",
    "DEFAULT",
    "TRACE",
    "VERBOSE",
    "LogOptions",
    "bind_contextvars",
    "bound_contextvars",
    "clear_contextvars",
    "configure_logging",
    "is_enabled_for",
    "level_for",
]

# GIE's verbosity numbers (pkg/epp/util/logging): logger.V(n) lines show when -v >= n.
DEFAULT: Final = 2
VERBOSE: Final = 3
DEBUG: Final = 4
TRACE: Final = 5

_ZAP_NAMED: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "error": logging.ERROR,
    "panic": logging.CRITICAL,
}
STDLIB_LEVEL: Final = logging.WARNING  # grpc, aiohttp, asyncio: only their warnings and errors


class LogOptions(Protocol):
    """What logging reads from ``epp.app.options.Options``."""

    @property
    def v(self) -> int: ...
    @property
    def zap_log_level(self) -> str: ...
    @property
    def log_format(self) -> str: ...


class _State:
    """Mirror of the level configured into structlog's process-wide config, for hot-path guards."""

    __slots__ = ("min_level",)

    def __init__(self) -> None:
        self.min_level = logging.INFO


_state: Final = _State()


def level_for(v: int, zap_log_level: str = "") -> int:
    """The stdlib level for ``-v`` (negative → 2) unless ``--zap-log-level`` names one.

    -v 0..3 is info (we have no level between info and debug for V(3) "verbose"), 4 and
    above is debug (TRACE lines are debug lines). A named zap level means what it says; an
    integer zap level N means ``-v=N``, as in controller-runtime.
    """
    if zap_log_level:
        named = _ZAP_NAMED.get(zap_log_level.lower())
        if named is not None:
            return named
        v = int(zap_log_level)
    if v < 0:
        v = DEFAULT
    return logging.DEBUG if v >= DEBUG else logging.INFO


def is_enabled_for(level: int) -> bool:
    """Cheap guard for expensive log fields: ``if is_enabled_for(logging.DEBUG): log.debug(...)``."""
    return level >= _state.min_level


def _zap_order(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
    """Lead with zap's keys (``ts``, ``level``, ``msg``) so GIE's log tooling reads our lines."""
    return {
        "ts": event_dict.pop("ts", None),
        "level": event_dict.pop("level", None),
        "msg": event_dict.pop("event", None),
        **event_dict,
    }


def _dumps(obj: Any, **_: Any) -> str:
    return orjson.dumps(obj, default=repr).decode()


def configure_logging(
    options: LogOptions,
    *,
    stream: TextIO | None = None,
    cache_loggers: bool = True,
) -> None:
    """Route structlog and the stdlib root logger to one renderer on ``stream`` (stderr).

    JSON lines carry ``ts`` (ISO 8601 UTC), ``level``, ``msg`` and the event's fields plus
    whatever is bound with ``bind_contextvars`` (e.g. ``request_id``). ``cache_loggers=False``
    is for tests that reconfigure logging.
    """
    out = stream if stream is not None else sys.stderr
    level = level_for(options.v, options.zap_log_level)
    _state.min_level = level
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts")
    renderer: Processor
    if options.log_format == "console":
        renderer = structlog.dev.ConsoleRenderer(
            colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback, timestamp_key="ts"
        )
        tail: list[Processor] = [renderer]
    else:
        renderer = structlog.processors.JSONRenderer(serializer=_dumps)
        tail = [structlog.processors.format_exc_info, _zap_order, renderer]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            timestamper,
            *tail,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        cache_logger_on_first_use=cache_loggers,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, structlog.stdlib.add_log_level, timestamper],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
    )
    handler = _Handler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(STDLIB_LEVEL)


class _Handler(logging.StreamHandler[TextIO]):
    """Our root handler, typed so a second ``configure_logging`` replaces it and nothing else."""
