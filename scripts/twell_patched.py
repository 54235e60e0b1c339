"""The twell CLI in a process where some module constants are set first: what the GPU call scripts use to time a
variant of a shipped constant (a hot-set bound, a switch) without a commit of its own.

    python3 scripts/twell_patched.py --set twell.ops.hot_cold_plan.HOT_MAX_COLD_L0=6.0 -- tune-dispatch --ms 8192

Each ``--set MODULE.NAME=VALUE`` imports MODULE and sets its existing attribute NAME to VALUE (a Python literal).
A name the module does not have is an error: a typo would otherwise time the shipped constant under a new label.
So is ``bench model`` without ``--isolation none``: its parts run in child processes, which the settings do not reach
(session 58's call 3 timed a patched ``RECORD_MAX_FLOPS`` that way and measured the shipped one).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys


def apply_setting(text: str) -> None:
    """Set ``MODULE.NAME`` to the literal after ``=``; ValueError names what is wrong."""
    target, sep, value = text.partition("=")
    module_name, _, name = target.strip().rpartition(".")
    if not sep or not module_name or not name:
        raise ValueError(f"a setting is MODULE.NAME=VALUE, got {text!r}")
    module = importlib.import_module(module_name)
    if not hasattr(module, name):
        raise ValueError(f"{module_name} has no attribute {name!r} to set")
    try:
        setattr(module, name, ast.literal_eval(value.strip()))
    except (ValueError, SyntaxError):
        raise ValueError(f"the value of {target.strip()} must be a Python literal, got {value!r}") from None


def check_in_process(cli: list[str]) -> None:
    """ValueError for a CLI command that would run in child processes the settings do not reach: ``bench model``
    unless ``--isolation none`` (its ``auto`` isolates the parts on CUDA)."""
    if cli[:2] != ["bench", "model"]:
        return
    isolation = None
    for i, arg in enumerate(cli):
        if arg == "--isolation" and i + 1 < len(cli):
            isolation = cli[i + 1]
        elif arg.startswith("--isolation="):
            isolation = arg.partition("=")[2]
    if isolation != "none":
        raise ValueError("bench model runs its parts in child processes, which --set does not reach: pass "
                         "--isolation none")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="MODULE.NAME=VALUE")
    ap.add_argument("cli", nargs=argparse.REMAINDER, help="-- then the twell CLI's arguments")
    a = ap.parse_args(argv)
    cli = a.cli[1:] if a.cli[:1] == ["--"] else a.cli
    check_in_process(cli)
    for text in a.settings:
        apply_setting(text)
    from twell.cli import main as twell_main

    return twell_main(cli)


if __name__ == "__main__":
    sys.exit(main())
