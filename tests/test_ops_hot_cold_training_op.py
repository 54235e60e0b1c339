"""The hot/cold training op as custom ops (twell::hot_cold_gated_ffn_l1 and its backward): the Function's
results bit for bit, opcheck (schema, fake shapes, autograd registration), and torch.compile with a
full graph giving the eager outputs and gradients."""

from __future__ import annotations

import pytest
import torch
from test_ops_training import make_problem

from twell.ops.hot_cold_training import hot_units, twell_gated_ffn_l1_hot_cold
from twell.ops.hot_cold_training_op import hot_cold_gated_ffn_l1_op

# m, d, f, frac_pos, hot units (every 9th or none), W, C: overflow into continuation rows, spill, no hot unit
CASES = [(37, 32, 128, 0.05, True, 4, 40), (24, 24, 96, 0.3, True, 4, 6), (12, 16, 64, 0.5, False, 8, 20)]


def _inputs(case):
    m, d, f, frac, with_hot, width, cont = case
    x, wg, wu, wd = (t.float() for t in make_problem(m, d, f, frac, seed=m + f))
    hot = hot_units(torch.arange(0, f, 9) if with_hot else torch.arange(0), f, cold_l0=4.0)
    return x, (wg, wu, wd), hot, width, cont


def _step(fn, x, ws):
    xs = x.clone().requires_grad_(True)
    wl = [w.clone().requires_grad_(True) for w in ws]
    out, l1 = fn(xs, *wl)
    grads = torch.autograd.grad((out, l1), (xs, *wl), (torch.linspace(-1, 1, out.numel()).view_as(out),
                                                          torch.tensor(0.3)))
    return out, l1, grads


@pytest.mark.parametrize("case", CASES, ids=["continuation", "spill", "no-hot"])
def test_custom_op_matches_the_function_bitwise(case):
    x, ws, hot, width, cont = _inputs(case)

    def function(xs, *wl):
        return twell_gated_ffn_l1_hot_cold(xs, *wl, hot, width=width, cont_rows=cont)[:2]

    def op(xs, *wl):
        res = hot_cold_gated_ffn_l1_op(xs, *wl, hot.ids, hot.columns, hot.slot, width, cont)
        return res[0], res[1]

    a, b = _step(function, x, ws), _step(op, x, ws)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for g, h in zip(a[2], b[2], strict=True):
        assert torch.equal(g, h)


def test_opcheck():
    x, ws, hot, width, cont = _inputs(CASES[0])
    args = (x.clone().requires_grad_(True), *(w.clone().requires_grad_(True) for w in ws), hot.ids, hot.columns,
            hot.slot, width, cont)
    torch.library.opcheck(torch.ops.twell.hot_cold_gated_ffn_l1.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_compiled_full_graph_matches_eager():
    """twell_gated_ffn_l1_hot_cold traced by torch.compile takes the custom op: no graph break
    (fullgraph=True would raise), the eager outputs and gradients bit for bit."""
    x, ws, hot, width, cont = _inputs(CASES[0])

    def fn(xs, *wl):
        return twell_gated_ffn_l1_hot_cold(xs, *wl, hot, width=width, cont_rows=cont)[:2]

    eager = _step(fn, x, ws)
    torch._dynamo.reset()
    compiled = _step(torch.compile(fn, backend="aot_eager", fullgraph=True), x, ws)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])
    for g, h in zip(eager[2], compiled[2], strict=True):
        assert torch.equal(g, h)
