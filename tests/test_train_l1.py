from __future__ import annotations

import pytest
import torch
from test_train_helpers import StandIn

from twell.tolerances import FP32_ELEMENT_TOL, FP32_ROUNDING_TOL
from twell.train.l1 import DEFAULT_L1_COEF, L1Schedule, l1_term, layer_l0, mean_l0, sparse_layers


def test_schedule_constant_and_warmup() -> None:
    s = L1Schedule()
    assert s.coef == DEFAULT_L1_COEF == 2e-5
    assert s(0) == s(10_000) == 2e-5
    w = L1Schedule(1e-2, warmup_steps=4)
    assert [w(i) for i in range(6)] == pytest.approx([2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2, 1e-2])
    with pytest.raises(ValueError):
        L1Schedule(-1.0)
    with pytest.raises(ValueError):
        L1Schedule(1e-3, warmup_steps=-1)
    with pytest.raises(ValueError):
        w(-1)


def test_l1_term_matches_manual_computation() -> None:
    torch.manual_seed(0)
    model = StandIn(n_layers=3).train()
    ids = torch.randint(0, 256, (2, 7))
    inputs: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda m, i, o: inputs.append(i[0].detach())) for m in sparse_layers(model)]
    model(ids)
    for h in hooks:
        h.remove()
    manual = []
    for layer, x in zip(sparse_layers(model), inputs, strict=True):
        x2 = x.reshape(-1, x.shape[-1])
        h = torch.relu(x2 @ layer.gate_proj.weight.T) * (x2 @ layer.up_proj.weight.T)
        manual.append(h.abs().sum(1).mean())
    term = l1_term(model)
    torch.testing.assert_close(term, torch.stack(manual).mean(), rtol=FP32_ELEMENT_TOL, atol=FP32_ROUNDING_TOL)
    term.backward()  # differentiable
    assert sparse_layers(model)[0].gate_proj.weight.grad is not None
    l0s = layer_l0(model)
    assert len(l0s) == 3 and all(0 < v <= 64 for v in l0s)
    assert mean_l0(model) == pytest.approx(sum(l0s) / 3)


def test_l1_term_errors() -> None:
    with pytest.raises(ValueError, match="no SparseGatedMLP"):
        l1_term(torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="last_l1"):
        l1_term(StandIn())
