"""Logging: verbosity mapping, JSON lines with bound request fields, stdlib routing."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import structlog

from epp import log as epp_log
from epp.log import bound_contextvars, configure_logging, is_enabled_for, level_for


@dataclass(frozen=True)
class Opts:
    v: int = 2
    zap_log_level: str = ""
    log_format: str = "json"


@pytest.fixture
def configure() -> Iterator[Any]:
    """Configure logging into a buffer; restore structlog, the root logger and the level mirror after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    min_level = epp_log._state.min_level

    def run(opts: Opts) -> io.StringIO:
        buf = io.StringIO()
        configure_logging(opts, stream=buf, cache_loggers=False)
        return buf

    yield run
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)
    epp_log._state.min_level = min_level


def lines(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


@pytest.mark.parametrize(
    ("v", "zap", "expected"),
    [
        pytest.param(2, "", logging.INFO, id="v2-default-info"),
        pytest.param(3, "", logging.INFO, id="v3-verbose-info"),
        pytest.param(4, "", logging.DEBUG, id="v4-debug"),
        pytest.param(5, "", logging.DEBUG, id="v5-trace-is-debug"),
        pytest.param(0, "", logging.INFO, id="v0-info"),
        pytest.param(-3, "", logging.INFO, id="negative-resets-to-2"),
        pytest.param(2, "debug", logging.DEBUG, id="zap-debug-overrides-v"),
        pytest.param(5, "info", logging.INFO, id="zap-info-overrides-v"),
        pytest.param(2, "ERROR", logging.ERROR, id="zap-error-any-case"),
        pytest.param(2, "panic", logging.CRITICAL, id="zap-panic"),
        pytest.param(2, "4", logging.DEBUG, id="zap-int-means-v"),
        pytest.param(5, "2", logging.INFO, id="zap-int-overrides-v"),
    ],
)
def test_level_for(v: int, zap: str, expected: int) -> None:
    """-v maps GIE's verbosity onto stdlib levels; --zap-log-level wins when given."""
    assert level_for(v, zap) == expected


def test_json_lines_carry_bound_request_fields(configure: Any) -> None:
    """Each JSON line leads with ts/level/msg and carries fields bound with bound_contextvars."""
    buf = configure(Opts())
    log = structlog.get_logger("t")
    with bound_contextvars(request_id="req-1", model="llama"):
        log.info("request_received", endpoints=3)
    log.info("outside")
    first, second = lines(buf)
    assert list(first)[:3] == ["ts", "level", "msg"]
    assert first["level"] == "info"
    assert first["msg"] == "request_received"
    assert first["request_id"] == "req-1"
    assert first["model"] == "llama"
    assert first["endpoints"] == 3
    assert first["ts"].endswith("Z")
    assert "request_id" not in second


@pytest.mark.parametrize(
    ("opts", "debug_shown"),
    [
        pytest.param(Opts(v=2), False, id="v2"),
        pytest.param(Opts(v=4), True, id="v4"),
        pytest.param(Opts(v=4, zap_log_level="info"), False, id="zap-info-wins"),
    ],
)
def test_debug_filtered_by_level(configure: Any, opts: Opts, debug_shown: bool) -> None:
    """Debug lines appear only at -v>=4 (or zap debug), and is_enabled_for agrees."""
    buf = configure(opts)
    structlog.get_logger("t").debug("detail")
    assert bool(lines(buf)) is debug_shown
    assert is_enabled_for(logging.DEBUG) is debug_shown
    assert is_enabled_for(logging.INFO)


def test_exceptions_are_rendered_into_the_line(configure: Any) -> None:
    """log.exception puts the traceback in an ``exception`` field of the same JSON line."""
    buf = configure(Opts())
    try:
        raise ValueError("boom")
    except ValueError:
        structlog.get_logger("t").exception("crashed")
    (line,) = lines(buf)
    assert line["level"] == "error"
    assert "ValueError: boom" in line["exception"]


def test_stdlib_logging_routed_at_warning(configure: Any) -> None:
    """grpc/aiohttp stdlib records become the same JSON lines, warnings and up only."""
    buf = configure(Opts(v=5))
    logging.getLogger("grpc._server").warning("slow %s", "handshake")
    logging.getLogger("aiohttp.access").info("GET /metrics 200")
    (line,) = lines(buf)
    assert line["msg"] == "slow handshake"
    assert line["logger"] == "grpc._server"
    assert line["level"] == "warning"


def test_reconfigure_replaces_only_our_handler(configure: Any) -> None:
    """Configuring twice leaves one handler of ours and keeps handlers someone else installed."""
    other = logging.NullHandler()
    logging.getLogger().addHandler(other)
    configure(Opts())
    buf = configure(Opts())
    ours = [h for h in logging.getLogger().handlers if isinstance(h, epp_log._Handler)]
    assert len(ours) == 1
    assert other in logging.getLogger().handlers
    logging.getLogger("x").error("once")
    assert len(lines(buf)) == 1


def test_console_format(configure: Any) -> None:
    """--log-format console renders human-readable lines with the event and its fields."""
    buf = configure(Opts(log_format="console"))
    with bound_contextvars(request_id="req-2"):
        structlog.get_logger("t").info("picked", endpoint="10.0.0.1:8000")
    text = buf.getvalue()
    assert "picked" in text
    assert "request_id=req-2" in text
    assert "endpoint=10.0.0.1:8000" in text
    assert not text.startswith("{")
