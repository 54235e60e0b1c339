"""The README's status figures for the inference FFN are what the committed sweep printed.

The "Status" bullet at the README's top and the issue-3 table under "Where it stands" quote session 30's whole sweep
at 2048x5632 (``bench_results/h200/ffn_sweep_session30.json``, interleaved with dense and held).  Each quoted figure
is rebuilt here from that file, formatted as the README writes it, and looked up in the README's text; a figure typed
by hand or left behind when the run it cites changes fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from twell.tolerances import REL_TOL

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "bench_results" / "h200" / "ffn_sweep_session30.json"


def _rows() -> dict[tuple[int, float], dict]:
    return {(r["m"], r["density_pct"]): r for r in json.loads(SWEEP.read_text())["rows"]}


def _section(start_marker: str) -> str:
    """The README from ``start_marker`` to the next second-level heading, whitespace folded (text wraps anywhere)."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index(start_marker)
    end = readme.index("\n## ", start + 1)
    return re.sub(r"\s+", " ", readme[start:end])


def _status_text() -> str:
    return _section("**Status**")


def _issue3_row(goal: str) -> str:
    """The "twell now" cell of the issue-3 table's row whose goal cell starts with ``goal``."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("\n## Where it stands")
    lines = readme[start:readme.index("\nIssue 4 (training", start)].splitlines()  # issue 4's table has M= rows too
    rows = [r for r in lines if r.startswith(f"| {goal}")]
    assert len(rows) == 1, f"one row of the issue-3 table starts with {goal!r}"
    return rows[0].split(" | ")[2]


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _span(values: list[float]) -> str:
    """A range as the README writes one: ``lo-hix``, or one figure when both ends round alike."""
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return f"{lo}x" if lo == hi else f"{lo}-{hi}x"


def _dispatched(rows: dict, m: int, pct: float) -> float:
    return rows[(m, pct)]["dispatch_speedup"]


def _op(rows: dict, m: int, pct: float) -> float:
    return rows[(m, pct)]["hotcold_speedup"]


def _claims() -> list[tuple[str, str]]:
    """(what the claim is about, the phrase the README must hold) for every figure the bullet quotes."""
    rows = _rows()
    d = _dispatched
    dens = sorted({pct for (m, pct) in rows if m == 4096})
    lowest = min(rows.values(), key=lambda r: round(r["dispatch_speedup"], 2))
    return [
        ("16,384 tokens / 0.5 %", f"**{_x(d(rows, 16384, 0.5))} at the paper's 0.5 % and 16,384 tokens**"),
        ("the op alone there", f"the op alone {_x(_op(rows, 16384, 0.5))}"),
        ("131,072 tokens / 0.5 %, dispatched and the op",
         f"{_x(d(rows, 131072, 0.5))} at 131,072 tokens (the op {_x(_op(rows, 131072, 0.5))};"),
        ("1 % at 16,384 / 131,072", f"{_x(d(rows, 16384, 1.0))} / {_x(d(rows, 131072, 1.0))} at 1 %"),
        ("0.25 % at both sizes",
         f"{_span([d(rows, 16384, 0.25), d(rows, 131072, 0.25)])} at 0.25 % at both sizes"),
        ("524,288 tokens", f"{_x(d(rows, 524288, 0.5))} at 524,288 tokens"),
        ("2-10 % from 16,384 tokens",
         f"{_span([d(rows, m, p) for m in (16384, 131072) for p in (2.0, 5.0, 10.0)])} at 2-10 % from 16,384 tokens"),
        ("4096 tokens", f"{_span([d(rows, 4096, p) for p in dens])} at 4096 tokens"),
        ("2048 tokens", f"{_span([d(rows, 2048, p) for p in dens])} at 2048"),
        ("1024 tokens / 0.25-0.5 %", f"{_span([d(rows, 1024, 0.25), d(rows, 1024, 0.5)])} at 1024 / 0.25-0.5 %"),
        ("one token", f"{_span([d(rows, 1, p) for p in dens])} at one token"),
        ("the lowest point",
         f"the lowest point {_x(lowest['dispatch_speedup'])} ({lowest['m']} tokens / {lowest['density_pct']:g} %)"),
    ]


def test_the_sweep_is_the_h200_run_the_readme_cites():
    meta = json.loads(SWEEP.read_text())["meta"]
    assert meta["device"] == "NVIDIA H200"
    assert meta["commit"] == "51ac348"
    assert "`ffn_sweep_session30.json`" in _status_text()


@pytest.mark.parametrize(("about", "phrase"), _claims(), ids=[about for about, _ in _claims()])
def test_each_status_figure_is_the_sweeps(about, phrase):
    assert phrase in _status_text(), f"README status on {about}: expected {phrase!r} (from {SWEEP.name})"


def test_every_point_of_the_sweep_is_within_the_error_bar_the_readme_states():
    rows = _rows()
    bar = REL_TOL[torch.bfloat16]
    worst = max(max(r["rel_err"], r.get("hotcold_rel_err") or 0.0) for r in rows.values())
    assert all(r["ok"] for r in rows.values())
    assert worst <= bar
    written = f"{bar:.1e}".replace("e-0", "e-")  # 5.0e-3, as the README writes it
    assert f"relative error <= {written} against an fp32 reference" in _status_text()


def _issue3_claims() -> list[tuple[str, str]]:
    """(the row's goal cell, the phrase its "twell now" cell must start with) for the issue-3 table."""
    rows = _rows()
    d, op = _dispatched, _op
    worst = max(rows.values(), key=lambda r: r["rel_err"])
    lowest = min(rows.values(), key=lambda r: round(r["dispatch_speedup"], 2))
    return [
        ("M=131072, 0.5 %", f"{_x(d(rows, 131072, 0.5))}, the op alone {_x(op(rows, 131072, 0.5))}"),
        ("M=16384, 0.5 %", f"**{_x(d(rows, 16384, 0.5))}**, the op alone {_x(op(rows, 16384, 0.5))}"),
        ("M=16384, 1 %", _x(d(rows, 16384, 1.0))),
        ("M=131072, 1 %", f"{_x(d(rows, 131072, 1.0))}, the op alone {_x(op(rows, 131072, 1.0))}"),
        ("M=131072, 0.25 %", _x(d(rows, 131072, 0.25))),
        ("M=131072, 2 % / 5 % / 10 %",
         " / ".join(_x(d(rows, 131072, p)) for p in (2.0, 5.0, 10.0))
         + " (16384: " + " / ".join(_x(d(rows, 16384, p)) for p in (2.0, 5.0, 10.0))),
        ("M = 524,288, 0.5 %", f"{_x(d(rows, 524288, 0.5))}, the op alone {_x(op(rows, 524288, 0.5))}"),
        ("relative error", f"<= {worst['rel_err']:.1e}".replace("e-0", "e-") + " at every point of the sweep"),
        ("no point below 0.95x",
         f"lowest {_x(lowest['dispatch_speedup'])} over the sweep's {len(rows)} points ({lowest['m']} tokens / "
         f"{lowest['density_pct']:g} %"),
    ]


@pytest.mark.parametrize(("goal", "phrase"), _issue3_claims(), ids=[goal for goal, _ in _issue3_claims()])
def test_each_issue3_table_figure_is_the_sweeps(goal, phrase):
    assert _issue3_row(goal).startswith(phrase), f"README issue-3 row {goal!r}: expected {phrase!r} first"


def test_span_writes_one_figure_when_both_ends_round_alike():
    assert _span([2.181, 2.176]) == "2.18x"
    assert _span([1.27, 1.414]) == "1.27-1.41x"
