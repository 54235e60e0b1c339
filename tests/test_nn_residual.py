"""fuse_residual_adds: the decoder layer's residual add after the MLP done by the MLP (``forward(x, residual=)``).

Tiny models on the CPU (hidden 64, 2 layers; torch backend, and the Triton hot/cold path in the interpreter for one
layer).  On the CPU every path keeps the bits of the unfused ``residual + mlp(x)``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="the decoder layers come from transformers")
from _helpers import TINY_ARCH, TINY_TWELL, assert_bitwise_equal, check_gradient_checkpointing  # noqa: E402
from test_nn_mlp_hot_cold import _layer, _x  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import twell.models as tm  # noqa: E402
from twell.nn import (  # noqa: E402
    DenseReluGatedMLP,
    DispatchPolicy,
    SparseGatedMLP,
    fuse_residual_adds,
    residual_adds_fused,
    unfuse_residual_adds,
)

FAMILIES = {"llama": (tm.TwellLlamaConfig, tm.TwellLlamaForCausalLM),
            "qwen2": (tm.TwellQwen2Config, tm.TwellQwen2ForCausalLM)}
POLICIES = {"sparse": DispatchPolicy.always_sparse(), "dense": DispatchPolicy.always_dense()}


def _model(family: str) -> torch.nn.Module:
    cfg_cls, lm_cls = FAMILIES[family]
    torch.manual_seed(0)
    return lm_cls(cfg_cls(**TINY_ARCH, **TINY_TWELL)).eval()


def _ids(batch: int = 2, seq: int = 9) -> torch.Tensor:
    return torch.randint(0, TINY_ARCH["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_layers_give_the_same_bits(family, policy):
    model = _model(family)
    tm.set_dispatch_policy(model, POLICIES[policy])
    ids = _ids()
    with torch.no_grad():
        want = model(ids).logits
        assert residual_adds_fused(model) == 0
        assert fuse_residual_adds(model) == 2 and residual_adds_fused(model) == 2
        assert fuse_residual_adds(model) == 0  # already fused
        got = model(ids).logits
        assert_bitwise_equal(got, want)
        assert unfuse_residual_adds(model) == 2 and residual_adds_fused(model) == 0
        assert_bitwise_equal(model(ids).logits, want)


def test_mlp_receives_the_residual(monkeypatch):
    model = _model("llama")
    seen = []
    real = SparseGatedMLP.forward

    def spy(self, x, residual=None):
        seen.append(residual is not None)
        return real(self, x, residual)

    monkeypatch.setattr(SparseGatedMLP, "forward", spy)
    fuse_residual_adds(model)
    with torch.no_grad():
        model(_ids())
    assert seen == [True, True]


def test_generate_and_training_match():
    model = _model("llama")
    ids = _ids(1, 6)
    want = model.generate(ids, max_new_tokens=5, do_sample=False)
    model.train()
    model.zero_grad()
    loss = model(ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    fuse_residual_adds(model)
    model.zero_grad()
    loss_f = model(ids, labels=ids).loss
    loss_f.backward()
    assert torch.equal(loss_f, loss)
    for n, p in model.named_parameters():
        if n in grads:
            assert torch.equal(p.grad, grads[n]), n
    model.eval()
    assert torch.equal(model.generate(ids, max_new_tokens=5, do_sample=False), want)


def test_other_mlps_add_it_themselves():
    """A transformers LlamaMLP (or an MLP swapped in after fusing) keeps the layer's own add."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_ARCH, hidden_act="relu")).eval()
    ids = _ids()
    with torch.no_grad():
        want = model(ids).logits
        assert fuse_residual_adds(model) == 2
        assert_bitwise_equal(model(ids).logits, want)
        tm.apply(model)  # SparseGatedMLPs swapped in after the fusion: they take the residual
        assert all(isinstance(layer.mlp, SparseGatedMLP) for layer in model.model.layers)
        tm.set_dispatch_policy(model, POLICIES["dense"])
        assert_bitwise_equal(model(ids).logits, want)


def test_copies_pickles_and_no_reference_cycle():
    """The fusion is a flag on the layer: deep copies and pickles keep it, and a fused layer is freed by its
    reference count (a per-layer bound method made a cycle that kept deleted models' weights alive)."""
    import copy
    import gc
    import io
    import weakref

    model = _model("llama")
    fuse_residual_adds(model)
    ids = _ids()
    with torch.no_grad():
        want = model(ids).logits
        twin = copy.deepcopy(model)
        assert residual_adds_fused(twin) == 2
        assert_bitwise_equal(twin(ids).logits, want)
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        assert residual_adds_fused(loaded) == 2
        assert_bitwise_equal(loaded(ids).logits, want)
    unfuse_residual_adds(twin)
    assert residual_adds_fused(twin) == 0 and residual_adds_fused(model) == 2  # per layer, not per class
    ref = weakref.ref(model.model.layers[0])
    gc.disable()
    try:
        del model
        assert ref() is None
    finally:
        gc.enable()


def test_a_pickle_loads_in_a_fresh_process(tmp_path):
    import subprocess
    import sys

    model = _model("qwen2")
    fuse_residual_adds(model)
    torch.save(model, tmp_path / "m.pt")
    code = ("import torch, twell.nn as n; m = torch.load(r'%s', weights_only=False); "
            "print(n.residual_adds_fused(m), type(m.model.layers[0]).__qualname__)" % (tmp_path / "m.pt"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["2", "FusedQwen2DecoderLayer"]


def test_gradient_checkpointing_still_checkpoints_fused_layers():
    """transformers' checkpointing wrapper runs for the fused layers (reentrant mode is refused by the L1 check,
    which it could only be if the layers were checkpointed) and non-reentrant gives the same gradients."""
    cfg_cls, lm_cls = FAMILIES["llama"]
    torch.manual_seed(0)
    model = lm_cls(cfg_cls(**TINY_ARCH, **TINY_TWELL, l1_coef=0.01)).double().train()
    fuse_residual_adds(model)
    check_gradient_checkpointing(model, _ids())


def test_positional_arguments_refused():
    model = _model("llama")
    fuse_residual_adds(model)
    layer = model.model.layers[0]
    h = torch.randn(1, 3, TINY_ARCH["hidden_size"])
    with pytest.raises(TypeError, match="by keyword"):
        layer(h, None)
    with pytest.raises(TypeError, match="nn.Module"):
        fuse_residual_adds("model")
    with pytest.raises(TypeError, match="nn.Module"):
        unfuse_residual_adds(3)


def test_a_layer_without_its_parts_refused():
    class LlamaDecoderLayer(torch.nn.Module):  # the name of a decoder layer, not its parts
        pass

    holder = torch.nn.Module()
    holder.layer = LlamaDecoderLayer()
    with pytest.raises(TypeError, match="has no input_layernorm, self_attn, post_attention_layernorm, mlp"):
        fuse_residual_adds(holder)


# ------------------------------------------------------------------------------------------------ the MLPs
@pytest.mark.parametrize("lead", [(5,), (2, 3)])
def test_mlps_residual_paths_cpu(lead):
    d, f = 16, 48
    torch.manual_seed(2)
    wg, wu, wd = torch.randn(f, d), torch.randn(f, d), torch.randn(d, f)
    x, res = torch.randn(*lead, d), torch.randn(*lead, d)
    dense = DenseReluGatedMLP(d, f)
    dense.load_state_dict({"gate_proj.weight": wg, "up_proj.weight": wu, "down_proj.weight": wd})
    with torch.no_grad():
        assert_bitwise_equal(dense(x, residual=res), res + dense(x))
        for policy in POLICIES.values():
            layer = SparseGatedMLP.from_weights(wg, wu, wd, backend="torch", tile=16, policy=policy).eval()
            assert_bitwise_equal(layer(x, residual=res), res + layer(x))
            assert_bitwise_equal(layer(x[:0], residual=res[:0]), layer(x[:0]))
    layer.train()
    xg = x.clone().requires_grad_()
    rg = res.clone().requires_grad_()
    layer(xg, residual=rg).sum().backward()
    assert torch.equal(rg.grad, torch.ones_like(res))  # the training path's add is autograd's


def test_hot_cold_layer_residual_interpreter():
    """The Triton hot/cold path (the interpreter here) with the residual fused into its gather."""
    layer = _layer()
    x = _x(40, seed=1)
    res = torch.randn(40, 32, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        base = layer(x)
        assert layer._hot_cold.chosen
        assert_bitwise_equal(layer(x, residual=res), res + base)


def test_mlp_residual_checked():
    layer = SparseGatedMLP(16, 32, backend="torch")
    x = torch.randn(3, 16)
    with pytest.raises(ValueError, match=r"residual has shape \(3, 8\)"):
        layer(x, residual=torch.randn(3, 8))
    with pytest.raises(TypeError, match="residual has dtype float64"):
        layer(x, residual=torch.randn(3, 16, dtype=torch.float64))
    with pytest.raises(TypeError, match="residual must be a torch.Tensor"):
        DenseReluGatedMLP(16, 32)(x, residual=1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["sparse", "dense"])
def test_gpu_bf16_fused_model(policy):
    """bf16 on CUDA, no FusedRMSNorm: the unfused layer's bits (with DENSE_RESIDUAL_ADDMM on, the dense path's addmm
    rounds the sum once: within a bf16 rounding of the unfused sum)."""
    from twell.nn import mlp
    from twell.tolerances import REL_TOL, rel_error

    cfg_cls, lm_cls = FAMILIES["llama"]
    torch.manual_seed(0)
    arch = {**TINY_ARCH, "hidden_size": 256, "intermediate_size": 1024}
    model = lm_cls(cfg_cls(**arch, twell_backend="triton", twell_tile=64)).to("cuda", torch.bfloat16).eval()
    tm.set_dispatch_policy(model, POLICIES[policy])
    ids = torch.randint(0, arch["vocab_size"], (4, 64), device="cuda")
    with torch.no_grad():
        want = model(ids).logits
        fuse_residual_adds(model)
        got = model(ids).logits
    if policy == "sparse" or not mlp.DENSE_RESIDUAL_ADDMM:
        assert_bitwise_equal(got, want)
    else:
        assert rel_error(got, want) <= REL_TOL[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_bf16_fused_add_norm(monkeypatch):
    """With FusedRMSNorms the attention's add and the post-attention norm run as one kernel in every layer:
    logits within the bf16 tolerance of the unfused model, for the sparse and the dense MLPs alike."""
    from twell.nn import fuse_rms_norms, residual
    from twell.tolerances import REL_TOL, rel_error

    calls = []
    real = residual.add_rms_norm
    monkeypatch.setattr(residual, "add_rms_norm", lambda *a: (calls.append(1), real(*a))[1])
    cfg_cls, lm_cls = FAMILIES["llama"]
    torch.manual_seed(0)
    arch = {**TINY_ARCH, "hidden_size": 256, "intermediate_size": 1024}
    model = lm_cls(cfg_cls(**arch, twell_backend="triton", twell_tile=64)).to("cuda", torch.bfloat16).eval()
    fuse_rms_norms(model)
    ids = torch.randint(0, arch["vocab_size"], (4, 64), device="cuda")
    for policy in POLICIES.values():
        tm.set_dispatch_policy(model, policy)
        unfuse_residual_adds(model)
        with torch.no_grad():
            want = model(ids).logits
            fuse_residual_adds(model)
            calls.clear()
            got = model(ids).logits
        assert len(calls) == 2
        assert rel_error(got, want) <= REL_TOL[torch.bfloat16]
