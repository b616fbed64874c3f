"""Text a client or the hardware chose, made safe to show: in a terminal, a
log line, a metric label or the journal."""

from __future__ import annotations

import unicodedata
from urllib.parse import urlsplit, urlunsplit

# Unicode categories that are not printable text: controls (C0, C1: escape
# sequences), formats (bidi overrides such as U+202E), line and paragraph
# separators (U+2028), surrogates, private use and unassigned.
NOT_TEXT = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def printable(text: str) -> bool:
    """One line of printable text: nothing a terminal or a label reader could
    take for a control, a new line or a change of direction."""
    return not any(unicodedata.category(c) in NOT_TEXT for c in text)


def escape_unprintable(text: str) -> str:
    """`text` with each character that is not printable as its Python escape."""
    if printable(text):
        return text
    return "".join(
        c if unicodedata.category(c) not in NOT_TEXT else c.encode("unicode_escape").decode()
        for c in text
    )


def shown(text: str, max_chars: int = 200) -> str:
    """`text` safe to log or journal whatever a client sent: escaped, and cut
    at `max_chars`."""
    out = escape_unprintable(text[:max_chars])
    return out if len(text) <= max_chars else f"{out}...({len(text)} characters)"


def redacted(url: str) -> str:
    """`url` without the password of its user part (`https://user:***@host/`),
    for logs, findings and the journal."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[2]}"))
