"""Colour for people at a terminal: whether a stream gets it, and the style
of each word that says something is wrong (a health state, a severity, a
source down). Output to a pipe or a file stays plain, and NO_COLOR
(https://no-color.org: set and not empty) turns it off everywhere."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TextIO

import click

# What each word calls for: yellow needs a look, red needs someone, bold
# magenta is out of service.
STYLES: Mapping[str, Mapping[str, Any]] = {
    "degraded": {"fg": "yellow"},
    "warn": {"fg": "yellow"},
    "unhealthy": {"fg": "red"},
    "critical": {"fg": "red", "bold": True},
    "DOWN": {"fg": "red"},
    "unknown": {"fg": "magenta"},
    "quarantined": {"fg": "magenta", "bold": True},
}

Paint = Callable[[str], str]


def plain(word: str) -> str:
    return word


def styled(word: str) -> str:
    """`word` in its style; a word without one as it is."""
    style = STYLES.get(word)
    return click.style(word, **style) if style else word


def colour_wanted(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Colour for `stream`: a terminal that can show it, unless NO_COLOR says no."""
    return stream.isatty() and not environ.get("NO_COLOR") and environ.get("TERM") != "dumb"
