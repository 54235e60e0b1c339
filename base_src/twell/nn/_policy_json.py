"""What the two policy files (:mod:`twell.nn.dispatch_file`, :mod:`twell.nn.train_dispatch_file`) do alike: read and
write the JSON, check the format tag, the version and the set of keys; each file's own fields are checked by its
reader."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any:
    """The JSON value stored at ``path``; a ValueError names the file when it is not JSON."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


def write_json(path: str | Path, data: dict) -> Path:
    """``data`` as indented JSON at ``path`` (its folder made if missing); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def check_header(data: object, *, source: str, what: str, fmt: str, version: int, keys: Iterable[str],
                 required: Iterable[str], other: str = "") -> dict:
    """``data`` as a dict whose ``format`` is ``fmt``, whose ``version`` is ``version``, with no key outside ``keys``
    and every one of ``required``; the exception names ``source``, ``what`` the file should hold, and ``other`` (a
    hint added to a format mismatch)."""
    if not isinstance(data, dict):
        raise TypeError(f"{source}: a {what} must be a JSON object, got {type(data).__name__}")
    if data.get("format") != fmt:
        raise ValueError(f"{source}: not a twell {what} (format {data.get('format')!r}, expected {fmt!r}{other})")
    if data.get("version") != version:
        raise ValueError(f"{source}: {what} version {data.get('version')!r} is not supported "
                         f"(this twell reads version {version})")
    keys = list(keys)
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise ValueError(f"{source}: unknown keys {unknown}; accepted: {keys}")
    missing = [k for k in required if k not in data]
    if missing:
        raise ValueError(f"{source}: missing keys {missing}")
    return data


def shape_table_list(data: dict, key: str, source: str) -> list:
    """``data[key]`` (default empty) checked to be a list of ``{"shape": [h, f], "table": rows}`` objects."""
    entries = data.get(key, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) and sorted(e) == ["shape", "table"]
                                                for e in entries):
        raise TypeError(f"{source}: {key} must be a list of {{'shape': [hidden_size, intermediate_size], "
                        f"'table': [[min_tokens, max_density], ...]}} objects, got {entries!r}")
    return entries
