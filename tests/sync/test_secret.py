"""The peer secret file (``epp.sync.secret``): what it accepts, and what a bad one says."""

from __future__ import annotations

import pytest

from epp.errors import ConfigError
from epp.sync.secret import MIN_CHARS, PeerSecret, parse_secrets

NEW = b"n3w-secret-0123456789"
OLD = b"0ld-secret-0123456789"


def test_one_secret_a_line_comments_and_blank_lines_skipped_order_kept() -> None:
    text = f"# rotated 2026-12\n\n{NEW.decode()}   # the one we present\n  {OLD.decode()}\n"
    assert parse_secrets(text, "f") == (NEW, OLD)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", r"f: no peer secret in the file"),
        ("# only a comment\n\n", r"f: no peer secret in the file"),
        (
            f"{NEW.decode()}\nshort\n",
            rf"f: line 2: a peer secret needs at least {MIN_CHARS} characters, got 5",
        ),
        ("two words-0123456789\n", r"f: line 1: a peer secret is visible ASCII without spaces"),
        ("tab\tseparated-0123456789\n", r"f: line 1: a peer secret is visible ASCII without spaces"),
        ("geheimnis-größer-als-16\n", r"f: line 1: a peer secret is visible ASCII without spaces"),
    ],
)
def test_a_bad_file_names_the_file_and_the_line(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_secrets(text, "f")


def test_any_secret_is_accepted_the_first_is_presented() -> None:
    secret = PeerSecret((NEW, OLD))
    assert secret.presented == NEW
    assert secret.authorization == b"Bearer " + NEW
    assert secret.accepts(NEW) and secret.accepts(OLD)
    for wrong in (b"", NEW[:-1], NEW + b"x", b"x" + NEW, NEW.upper()):
        assert not secret.accepts(wrong), wrong
    assert secret.accepts_authorization(b"Bearer " + OLD)
    for header in (NEW, b"bearer " + NEW, b"Basic " + NEW, b"Bearer  " + NEW, b"Bearer"):
        assert not secret.accepts_authorization(header), header


def test_listeners_run_when_the_secrets_change_and_only_then() -> None:
    secret = PeerSecret((OLD,))
    calls: list[bytes] = []
    secret.on_change(lambda: calls.append(secret.presented))
    secret.set((OLD,))  # the same file read again (a touched file, a poll): no change
    assert calls == []
    secret.set((NEW, OLD))
    assert calls == [NEW]
    assert secret.accepts(OLD)
    secret.set((NEW,))
    assert calls == [NEW, NEW] and not secret.accepts(OLD)
    with pytest.raises(ValueError, match="at least one secret"):
        secret.set(())
