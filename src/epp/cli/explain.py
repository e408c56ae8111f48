"""``epp explain``: print the decision table for one request replayed offline (docs/explain.md)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import orjson

from epp.errors import ConfigError
from epp.explain.offline import Replay, load_snapshot, replay
from epp.explain.table import render
from epp.log import configure_logging


@dataclass(frozen=True, slots=True)
class _Quiet:
    """Logging for a one-shot command: errors only, on stderr."""

    v: int = 0
    zap_log_level: str = "error"
    log_format: str = "console"


USAGE = "epp explain --config-file FILE --endpoints FILE --body FILE|- [--header K=V]... [--path P] [--json]"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epp explain",
        usage=USAGE,
        description="Replay one request through the configured pipeline, offline, and print why it "
        "went where it went: each filter's survivors, each scorer's weighted score, the pick.",
    )
    p.add_argument("--config-file", default="", help="EndpointPickerConfig (default: the built-in one)")
    p.add_argument(
        "--endpoints",
        required=True,
        help="endpoints snapshot: the JSON of /debug/plugins/state, or a YAML/JSON file of endpoints",
    )
    p.add_argument("--body", required=True, help="request body file, or - for stdin")
    p.add_argument(
        "--header", action="append", default=[], metavar="K=V", help="a request header (repeatable)"
    )
    p.add_argument("--path", default="/v1/chat/completions", help="request path (default %(default)s)")
    p.add_argument(
        "--timeout", type=float, default=5.0, help="give up waiting in admission after this many s"
    )
    p.add_argument(
        "--json", action="store_true", help="print the decision as JSON (as /debug/decisions does)"
    )
    return p


def _read(path: str, stdin: TextIO) -> bytes:
    if path == "-":
        return stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode()
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {path!r}: {e.strerror or e}") from None


def _headers(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for h in items:
        k, sep, v = h.partition("=")
        if not sep or not k.strip():
            raise ConfigError(f"--header {h!r}: expected K=V")
        out[k.strip().lower()] = v
    return out


def main(argv: Sequence[str], *, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    """0: printed the decision (whatever its outcome); 1: bad arguments or config."""
    args = _parser().parse_args(list(argv))
    configure_logging(_Quiet(), cache_loggers=False)
    try:
        r = Replay(
            config_file=args.config_file,
            endpoints=load_snapshot(_read(args.endpoints, stdin).decode(), source=args.endpoints),
            body=_read(args.body, stdin),
            path=args.path,
            headers=_headers(args.header),
            timeout=args.timeout,
            env=dict(os.environ),
        )
        decision = asyncio.run(replay(r))
    except ConfigError as e:
        print(f"epp explain: {e}", file=sys.stderr)
        return 1
    if args.json:
        stdout.write(orjson.dumps(decision, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        stdout.write(render(decision) + "\n")
    return 0
