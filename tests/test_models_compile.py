"""twell models under torch.compile (aot_eager, CPU): the same logits, loss, L1 term and gradients as eager.

The sparse inference path runs through the twell custom ops (torch backend here); the training path
through the sparse autograd reference.  Graph breaks are allowed: what must hold is that compiling
changes nothing.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="twell.models needs the hf extra")
from test_models_hf import _twell_model  # noqa: E402

from twell.nn import DispatchPolicy, SparseGatedMLP  # noqa: E402
from twell.tolerances import FP32_ELEMENT_TOL, FP32_ROUNDING_TOL, FP32_UNIT_ABS_TOL  # noqa: E402


def _sparse_everywhere(model: torch.nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, SparseGatedMLP):
            m.policy = DispatchPolicy.always_sparse()
            m.train_impl = "sparse-reference"


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_compiled_inference_matches_eager(family):
    model = _twell_model(family).eval()
    _sparse_everywhere(model)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        compiled = torch.compile(model, backend="aot_eager")
        for _ in range(2):  # the second call runs the cached graphs
            assert torch.equal(compiled(ids).logits, want)


def test_compiled_training_step_matches_eager():
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2))
    results = []
    for compile_it in (False, True):
        model = _twell_model("llama").train()
        _sparse_everywhere(model)
        run = torch.compile(model, backend="aot_eager") if compile_it else model
        out = run(ids, labels=ids)
        out.loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        results.append((out.loss.detach(), out.l1_loss.detach(), grads))
    (loss_e, l1_e, g_e), (loss_c, l1_c, g_c) = results
    assert torch.allclose(loss_c, loss_e, rtol=FP32_ROUNDING_TOL) and torch.allclose(l1_c, l1_e, rtol=FP32_ROUNDING_TOL)
    assert len(g_c) == len(g_e) > 0
    for a, b in zip(g_c, g_e, strict=True):
        assert torch.allclose(a, b, rtol=FP32_ELEMENT_TOL, atol=FP32_UNIT_ABS_TOL)
