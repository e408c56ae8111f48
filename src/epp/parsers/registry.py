"""Several parsers on one EPP: each request goes to the parser claiming its path (llm-d-router).

llm-d-router's ``requestHandler.parsers`` lists parsers in order; each claims path suffixes
(``PATHS``).  Its ``ParserRegistry`` (pkg/epp/handlers/parsers.go) resolves a request's path to
the parser whose claimed suffix is the longest match (plain string suffix after trimming
slashes: ``generate`` matches ``/inference/v1/generate`` but ``inference/v1/generate`` wins);
on a tie the parser listed first wins.  A parser claiming no paths (``passthrough-parser``) is
the fallback for unclaimed paths, and registration stops there: parsers after it are skipped.
A second parser of a type already listed is skipped.  A path nobody claims, with no fallback,
is refused ``400`` with ``no parser registered matching path suffix for: <path>``.

Only built when more than one parser is listed; one parser is called directly, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import ClassVar, Final

from epp.errors import BadRequest, ConfigError
from epp.parsers.api import Parser
from epp.parsers.plugins.openai import request_path
from epp.plugin.base import TypedName

_LOG = logging.getLogger(__name__)
_NO_PARSER: Final = "no parser registered matching path suffix for: "


def claimed_paths(parser: Parser) -> tuple[str, ...]:
    """The path suffixes ``parser`` claims (its ``PATHS``); none makes it a fallback."""
    paths: tuple[str, ...] = getattr(parser, "PATHS", ())
    return paths


def _normalize(suffix: str) -> str:
    return suffix.strip().strip("/")


class ParserRegistry:
    """The parsers of ``requestHandler.parsers``, resolved per request by longest claimed suffix."""

    TYPE: ClassVar[str] = "parser-registry"

    __slots__ = ("APP_PROTOCOLS", "_entries", "_fallback", "_typed_name", "parsers")

    def __init__(self, parsers: Sequence[Parser]) -> None:
        kept: list[Parser] = []
        entries: list[tuple[str, Parser]] = []
        fallback: Parser | None = None
        seen: set[str] = set()
        for i, parser in enumerate(parsers):
            type_name = parser.typed_name.type
            duplicate = type_name in seen
            if duplicate:
                _LOG.warning("parser type %s is already listed, skipping %s", type_name, parser.typed_name)
            else:
                seen.add(type_name)
                kept.append(parser)
            paths = claimed_paths(parser)
            if not paths:  # upstream: the fallback even when its type was listed before
                fallback = parser
                for skipped in parsers[i + 1 :]:
                    _LOG.warning(
                        "parser %s is skipped: it is listed after the fallback parser %s",
                        skipped.typed_name,
                        parser.typed_name,
                    )
                break
            if not duplicate:
                # An empty suffix never wins upstream (a match must be longer than 0).
                entries.extend((s, parser) for s in map(_normalize, paths) if s)
        # Longest suffix first; sorted() is stable, so on equal lengths the parser listed first wins.
        self._entries: tuple[tuple[str, Parser], ...] = tuple(
            sorted(entries, key=lambda e: len(e[0]), reverse=True)
        )
        self._fallback = fallback
        self.parsers: tuple[Parser, ...] = tuple(kept)
        self._typed_name = TypedName(self.TYPE, ",".join(p.typed_name.name for p in kept))
        # llm-d's health check wants every parser that names protocols to support the pool's.
        named = [p.APP_PROTOCOLS for p in kept if p.APP_PROTOCOLS]
        protocols = frozenset.intersection(*named) if named else frozenset()
        if named and not protocols:
            raise ConfigError(
                "requestHandler.parsers: the parsers serve no appProtocol in common "
                f"({', '.join(str(p.typed_name) for p in kept)})"
            )
        self.APP_PROTOCOLS: frozenset[str] = protocols

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def resolve_path(self, path: str) -> Parser:
        """The parser for ``path``; ``BadRequest`` when none claims it and there is no fallback."""
        trimmed = path.strip().rstrip("/")
        for suffix, parser in self._entries:
            if trimmed.endswith(suffix):
                return parser
        if self._fallback is not None:
            return self._fallback
        raise BadRequest(_NO_PARSER + path)

    def resolve(self, headers: Mapping[str, str]) -> Parser:
        """The parser for a request with these headers (its path: ``:path``, then the fallbacks)."""
        return self.resolve_path(request_path(headers))

    def __repr__(self) -> str:
        return f"<ParserRegistry {self._typed_name.name}>"
