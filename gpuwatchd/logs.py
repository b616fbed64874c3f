"""Logging in a form journald keeps: one line an event, with the syslog level
prefix journald reads from stderr (`<4>`), then logfmt fields: level, the
logger, the subject when one is given, and the message. In a terminal (no
journald to stamp them) each line starts with its UTC time."""

from __future__ import annotations

import datetime
import logging
import sys

from gpuwatchd.text import escape_unprintable

_SYSLOG_LEVELS = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


def _quote(text: str) -> str:
    """A logfmt value: quotes and backslashes escaped, a new line as \\n, and
    every other character that is not printable text (a terminal escape, a
    bidi override) as its Python escape: no text a client chose can drive
    the terminal that shows the log."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escape_unprintable(escaped)}"'


class JournalFormatter(logging.Formatter):
    def __init__(self, syslog_prefix: bool) -> None:
        super().__init__()
        self.syslog_prefix = syslog_prefix

    def format(self, record: logging.LogRecord) -> str:
        fields = [f"level={record.levelname.lower()}", f"logger={record.name}"]
        if not self.syslog_prefix:
            moment = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
            stamp = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            fields.insert(0, f"time={stamp}")
        subject = getattr(record, "subject", None)
        if subject:
            fields.append(f"subject={subject}")
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}: {self.formatException(record.exc_info)}"
        fields.append(f"msg={_quote(message)}")
        line = " ".join(fields)
        if self.syslog_prefix:
            line = f"<{_SYSLOG_LEVELS.get(record.levelno, 6)}>{line}"
        return line


def setup(level: str, journal: bool) -> None:
    """Log to stderr; `journal` adds the syslog level prefix for journald."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JournalFormatter(syslog_prefix=journal))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
