"""Writing a simulated sysfs tree as the kernel shows it: whole files at once.

Each file is written in a staging folder beside the tree, then renamed into
place, so a concurrent reader never sees half a file; a file is rewritten
only when its text changed.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from pathlib import Path


class TreeWriter:
    def __init__(self, root: Path, name: str) -> None:
        # Beside the tree, not in it: a reader listing a folder must not see
        # a file being written. One folder per writer: their names are their own.
        self._staging = Path(root) / f".gpuwatchd-sim-staging-{name}"
        self._names = itertools.count()
        self._written: dict[Path, str] = {}

    def write_all(self, directory: Path, files: Mapping[str, str]) -> None:
        for relative, text in files.items():
            self.write(directory / relative, text + "\n")

    def write(self, path: Path, text: str) -> None:
        if self._written.get(path) == text:
            return
        temporary = self._staged(path)
        temporary.write_text(text, encoding="ascii")
        os.replace(temporary, path)
        self._written[path] = text

    def link(self, path: Path, target: str) -> None:
        """`path` as a symbolic link to `target`, swapped in atomically."""
        marker = f"-> {target}"
        if self._written.get(path) == marker:
            return
        temporary = self._staged(path)
        temporary.symlink_to(target)
        os.replace(temporary, path)
        self._written[path] = marker

    def _staged(self, path: Path) -> Path:
        """A fresh name in the staging folder for what will replace `path`."""
        if path not in self._written:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._staging.mkdir(exist_ok=True)
        return self._staging / f"{next(self._names)}.tmp"
