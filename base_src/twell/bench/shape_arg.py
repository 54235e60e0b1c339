"""The ``--shape HIDDENxFFN`` argument the benchmark and probe command lines share."""

from __future__ import annotations

import argparse


def parse_shape(text: str) -> tuple[int, int]:
    """``(hidden, ffn)`` from ``"2048x5632"`` (either case of ``x``); an ``argparse`` type, so a bad value is
    refused with the accepted form named."""
    try:
        d, f = (int(v) for v in text.lower().split("x"))
    except ValueError:
        d = f = 0
    if d < 1 or f < 1:
        raise argparse.ArgumentTypeError(f"shape must be HIDDENxFFN with two integers >= 1, e.g. 2048x5632, "
                                         f"got {text!r}")
    return d, f
