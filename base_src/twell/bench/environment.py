"""What ran: device name, library versions, git commit — stored with every result file."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import torch


def git_commit() -> str:
    """The commit that ran: ``TWELL_COMMIT`` when set (the GPU machine gets a copy without history), else git."""
    if os.environ.get("TWELL_COMMIT"):
        return os.environ["TWELL_COMMIT"]
    try:
        root = Path(__file__).resolve().parents[3]
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
        commit = out.stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=10, check=False,
        ).stdout.strip()
        return (commit + ("-dirty" if dirty else "")) if commit else "unknown"
    except Exception:
        return "unknown"


def environment(device: torch.device) -> dict[str, str]:
    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = "not installed"
    env = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": str(torch.version.cuda),
        "python": platform.python_version(),
        "commit": git_commit(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["sm_count"] = str(props.multi_processor_count)
        env["capability"] = f"{props.major}.{props.minor}"
    return env
