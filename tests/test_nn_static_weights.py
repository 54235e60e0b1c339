"""twell.nn.prepare_static_weights: every SparseGatedMLP of a model prepared for recorded calls, in module order."""

from __future__ import annotations

import pytest
import torch

from twell.nn import SparseGatedMLP, prepare_static_weights


class _Block(torch.nn.Module):
    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.mlp = SparseGatedMLP(d, f)


def test_prepares_every_sparse_layer_in_module_order(monkeypatch):
    model = torch.nn.Sequential(_Block(32, 64), torch.nn.Linear(32, 32), _Block(32, 128))
    shared = model[0].mlp
    model.append(torch.nn.ModuleDict({"again": shared}))  # a layer reached twice is prepared once
    seen: list[int] = []
    real = SparseGatedMLP.prepare_static_weights

    def spy(self: SparseGatedMLP) -> bool:
        seen.append(id(self))
        return real(self)

    monkeypatch.setattr(SparseGatedMLP, "prepare_static_weights", spy)
    ready = prepare_static_weights(model)
    assert seen == [id(model[0].mlp), id(model[2].mlp)]
    assert len(ready) == 2 and all(isinstance(r, bool) for r in ready)
    # the same answers as the layers' own calls
    assert ready == [real(model[0].mlp), real(model[2].mlp)]


def test_a_layer_alone():
    mlp = SparseGatedMLP(16, 32)
    assert prepare_static_weights(mlp) == [mlp.prepare_static_weights()]


def test_refuses_a_model_without_sparse_layers_and_non_modules():
    with pytest.raises(ValueError, match="Sequential holds no SparseGatedMLP layer: convert its MLPs first"):
        prepare_static_weights(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got dict"):
        prepare_static_weights({"mlp": SparseGatedMLP(16, 32)})
