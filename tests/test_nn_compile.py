"""SparseGatedMLP's inference path under torch.compile (aot_eager, CPU): one graph, eager's outputs.

The eager path counts calls and refreshes l0 every few calls; traced, that state made dynamo recompile
on every call until its cache limit, after which the layer ran uncompiled.  The traced path decides
from the current estimate only.
"""

from __future__ import annotations

import pytest
import torch
from test_nn_mlp import D, make_layer, make_x
from torch._dynamo.utils import counters

from twell.nn import DispatchPolicy

POLICIES = {
    "dense": DispatchPolicy.always_dense(),
    "sparse": DispatchPolicy.always_sparse(),
    "decode": DispatchPolicy(table=(), decode_max_tokens=8, force=True),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_compiled_layer_is_one_graph_with_eager_outputs(name):
    torch._dynamo.reset()
    counters.clear()
    layer = make_layer(torch.float32, policy=POLICIES[name]).eval()
    x = make_x((4, D), seed=0, dtype=torch.float32)
    with torch.no_grad():
        want = layer(x)  # eager: sets the l0 estimate the traced path reads
        compiled = torch.compile(layer, backend="aot_eager")
        for _ in range(12):
            assert torch.equal(compiled(x), want)
    assert counters["frames"]["total"] == 1  # no recompilation and no graph break
