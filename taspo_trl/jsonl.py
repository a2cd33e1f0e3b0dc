"""Reading JSON-lines files (skill banks, corpora, QA sets, logs) with errors that name the file and line."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def json_lines(lines: Iterable[str], source: str | Path) -> Iterator[tuple[int, Any]]:
    """``(line number, decoded value)`` of every non-blank line.

    A line that is not JSON raises ``ValueError("<source>:<line>: not valid JSON (...)")``; what the values must
    look like is the caller's to check, with its own message.
    """
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{source}:{number}: not valid JSON ({error.msg} at column {error.colno}).") from None


def read_json_objects(path: str | Path, expected: str) -> list[dict[str, Any]]:
    """Every line of the file at ``path`` as a JSON object; ``expected`` describes a line for the error message."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, row in json_lines(handle, path):
            if not isinstance(row, dict):  # malformed file content, not a bad argument: a ValueError
                raise ValueError(f"{path}:{number}: expected {expected}, got {type(row).__name__}.")  # noqa: TRY004
            rows.append(row)
    return rows
