"""What `gpuwatchd report` keeps out of a bundle, and what `--anonymize`
replaces in it.

Out of every bundle: each secret the config reaches (the API token file's
tokens, each webhook's URL, which for Slack or Teams is its key, and the
contents of its secret and routing-key files, the fleet check's Prometheus
URL) and the host's names (the host name and its first label, the node
names the config gives webhooks, Slurm and Kubernetes, its external URL's
host), wherever they stand in a member's text: written `<redacted>` and
`<host>`. A bundle is made of the daemon's records and the node's NVML and
InfiniBand answers, none of which should hold them; this pass makes sure. A
secret shorter than MIN_SECRET_CHARS cannot be told from other text and is
not searched for (the manifest says how many were not).

`--anonymize` also replaces every GPU UUID (NVML's GPU-<8-4-4-4-12 hex>), each
serial number the bundle names and the HCA node GUIDs, with stable
pseudonyms: the capture's own for what it recorded (`capture.pseudonyms`),
numbered apart from those for the rest.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from gpuwatchd.config import Config
from gpuwatchd.server import token_secrets

MIN_SECRET_CHARS = 6
SECRET = "<redacted>"
HOST = "<host>"
GPU_UUID = re.compile(
    r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
# Pseudonyms for boards the capture did not record (gone from the node):
# numbered from here, past any index the capture's can have.
ABSENT_BOARDS_FROM = 0x10000
# A host name stands alone: not inside a longer name (a trailing dot ends
# a sentence, not a name: the longer names, FQDNs, are taken out first).
_BEFORE_NAME = "(?<![A-Za-z0-9_.-])"
_AFTER_NAME = "(?![A-Za-z0-9_-])"


@dataclass(frozen=True)
class Redactions:
    secrets: tuple[str, ...]
    hosts: tuple[str, ...]
    too_short: int = 0  # secrets not searched for

    def apply(self, text: str) -> tuple[str, int]:
        """`text` without the secrets and host names; how many were taken out."""
        count = 0
        for secret in self.secrets:
            # As written, and as JSON writes it inside a string.
            for form in dict.fromkeys((secret, json.dumps(secret)[1:-1])):
                count += text.count(form)
                text = text.replace(form, SECRET)
        for host in self.hosts:
            pattern = re.compile(_BEFORE_NAME + re.escape(host) + _AFTER_NAME, re.IGNORECASE)
            text, found = pattern.subn(HOST, text)
            count += found
        return text, count


def redactions(config: Config, token_file: str) -> Redactions:
    """The secrets and host names to keep out of what is made on this node
    with `config` (and the API token file `token_file`)."""
    found = [text.strip() for text in _secrets(config, token_file) if text.strip()]
    kept = sorted({text for text in found if len(text) >= MIN_SECRET_CHARS}, key=len, reverse=True)
    short = len({text for text in found if len(text) < MIN_SECRET_CHARS})
    hosts = sorted({name for name in _hosts(config) if name}, key=len, reverse=True)
    return Redactions(tuple(kept), tuple(hosts), short)


def _secrets(config: Config, token_file: str) -> Iterator[str]:
    paths = [token_file]
    for webhook in config.actions.webhooks:
        yield webhook.url
        paths += [path for path in (webhook.secret_file, webhook.routing_key_file) if path]
    if config.actions.fleet_safety.prometheus_url:
        yield config.actions.fleet_safety.prometheus_url
    yield from _file_secrets(token_file)
    for path in paths[1:]:
        yield from _file_text(path)


def _file_secrets(path: str) -> tuple[str, ...]:
    try:
        return token_secrets(path)
    except OSError:
        return ()  # none there to leak


def _file_text(path: str) -> tuple[str, ...]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return (handle.read(),)
    except OSError:
        return ()


def _hosts(config: Config) -> Iterator[str | None]:
    name = socket.gethostname()
    yield name
    yield name.split(".")[0]
    actions = config.actions
    yield actions.node_name
    yield actions.slurm.node_name
    yield actions.kubernetes.node_name
    if actions.external_url:
        yield urllib.parse.urlsplit(actions.external_url).hostname


def pseudonyms(
    capture_pseudonyms: Mapping[str, str], texts: Iterable[str], serials: Iterable[str]
) -> dict[str, str]:
    """Original -> pseudonym for every GPU UUID in `texts` and each serial:
    the capture's where it has one, the others numbered in order."""
    mapping = {original.lower(): pseudonym for original, pseudonym in capture_pseudonyms.items()}
    others = sorted(
        {found.lower() for text in texts for found in GPU_UUID.findall(text)} - set(mapping)
    )
    for position, uuid in enumerate(others, ABSENT_BOARDS_FROM):
        mapping[uuid] = f"GPU-00000000-0000-4000-8000-{position:012x}"
    for position, serial in enumerate(sorted(set(serials) - set(mapping)), ABSENT_BOARDS_FROM):
        mapping[serial.lower()] = f"serial-{position}"
    return mapping


def anonymized(text: str, mapping: Mapping[str, str]) -> str:
    """`text` with each original of `mapping` (any case, as a whole word)
    replaced by its pseudonym."""
    if not mapping:
        return text
    words = sorted(mapping, key=len, reverse=True)
    pattern = re.compile(
        rf"(?<![A-Za-z0-9])({'|'.join(map(re.escape, words))})(?![A-Za-z0-9])", re.IGNORECASE
    )
    return pattern.sub(lambda match: mapping[match.group(1).lower()], text)
