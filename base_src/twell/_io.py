"""Small file helpers shared by the benchmarks and the training scripts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON through a temporary file and a rename: a reader never sees half a file,
    and a process killed mid-write leaves the previous version in place."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)
