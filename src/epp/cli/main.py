"""``epp``: parse flags, configure logging, build everything, then serve until told to stop."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence

import structlog

from epp.app.compose import App, build_app
from epp.app.serve import serve
from epp.cli.flags import HelpRequested, parse_flags
from epp.errors import ConfigError
from epp.log import configure_logging

log = structlog.get_logger(__name__)


def _run(app: App) -> int:
    """Serve on uvloop when available (cheaper per message, tooling.md), else plain asyncio."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        return asyncio.run(serve(app))
    return uvloop.run(serve(app))


def main(argv: Sequence[str] | None = None) -> None:
    """Exit 0 after a clean shutdown, 1 on a bad flag or config (nothing was started), 2 on a crash."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] == "explain":  # subcommand: replay one request offline (docs/explain.md)
        from epp.cli.explain import main as explain

        sys.exit(explain(args[1:]))
    try:
        options = parse_flags(args, os.environ)
    except HelpRequested as h:
        print(h.text)
        sys.exit(0)
    except ConfigError as e:
        print(f"epp: {e}", file=sys.stderr)
        sys.exit(1)
    configure_logging(options)
    for notice in options.notices:
        log.warning("deprecated", notice=notice)
    try:
        app = build_app(options, os.environ)
    except ConfigError as e:
        log.error("startup_failed", error=str(e))  # noqa: TRY400 - the message is the diagnosis; no traceback
        print(f"epp: {e}", file=sys.stderr)
        sys.exit(1)
    try:
        code = _run(app)
    except ConfigError as e:  # raised while starting (e.g. a TLS certificate that cannot be read)
        log.error("startup_failed", error=str(e))  # noqa: TRY400 - the message is the diagnosis
        print(f"epp: {e}", file=sys.stderr)
        sys.exit(1)
    except Exception:
        log.exception("epp_crashed")
        sys.exit(2)
    sys.exit(code)
