"""The fused rotary embedding (twell.ops.rope_kernel, twell.nn.rope) against transformers' ``apply_rotary_pos_emb``:
the same bits forward, the gradient of the formula backward, the formula itself for inputs the kernel does not
take, and models with :func:`fuse_rotary` giving the same logits and generations as without.

Triton under TRITON_INTERPRET=1 on the CPU (CI), natively on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import TINY_ARCH, TINY_TWELL
from transformers.models.llama import modeling_llama
from transformers.models.qwen2 import modeling_qwen2

import twell.models as tm
from twell.nn import fuse_rotary, rope, unfuse_rotary
from twell.nn.rope import _kernel_takes, apply_rotary_pos_emb, rotary_embedding
from twell.reference.rope import rotary_embedding_backward
from twell.tolerances import REL_TOL, rel_error

HF_ROPE = modeling_llama.apply_rotary_pos_emb


def _inputs(bsz, seq, heads, kv_heads, dim, dtype, device, *, unsqueeze_dim=1, cos_batch=None, seed=0):
    """q, k as the attention layers make them (views of [B, S, H, D] projections), cos / sin [B or 1, S, D]."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(bsz, seq, heads, dim, generator=gen).to(dtype).to(device)
    k = torch.randn(bsz, seq, kv_heads, dim, generator=gen).to(dtype).to(device)
    if unsqueeze_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    cb = bsz if cos_batch is None else cos_batch
    cos = torch.randn(cb, seq, dim, generator=gen).to(dtype).to(device)
    sin = torch.randn(cb, seq, dim, generator=gen).to(dtype).to(device)
    return q, k, cos, sin


CASES = [
    # bsz, seq, heads, kv_heads, dim, unsqueeze_dim, cos_batch
    (2, 5, 4, 2, 16, 1, None),  # grouped keys, the attention layers' transposed views
    (1, 1, 3, 3, 6, 1, None),  # one token, heads and half-dimension not powers of two
    (3, 7, 4, 1, 64, 2, None),  # [B, S, H, D] layout
    (2, 9, 2, 2, 32, 1, 1),  # cos / sin broadcast over the batch
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}-s{c[1]}-h{c[2]}-kv{c[3]}-d{c[4]}-u{c[5]}-cb{c[6]}"
                                             for c in CASES])
def test_same_bits_as_transformers(case, dtype, device):
    bsz, seq, heads, kv_heads, dim, unsq, cos_batch = case
    q, k, cos, sin = _inputs(bsz, seq, heads, kv_heads, dim, dtype, device, unsqueeze_dim=unsq, cos_batch=cos_batch)
    assert _kernel_takes(q, cos, sin, unsq) and _kernel_takes(k, cos, sin, unsq)
    want_q, want_k = HF_ROPE(q, k, cos, sin, unsqueeze_dim=unsq)
    got_q, got_k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsq)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert got_q.shape == q.shape and got_q.stride() == q.stride()  # the input's layout, as empty_like keeps it


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gradient_of_the_formula(dtype, device):
    """Backward: the float32 gradient of x * cos + rotate_half(x) * sin, rounded once (equal in float32)."""
    q, _, cos, sin = _inputs(2, 6, 4, 4, 16, dtype, device, seed=3)
    x = q.detach().clone().requires_grad_()
    out = rotary_embedding(x, cos, sin)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(dtype).to(device)
    out.backward(grad)
    x32 = q.detach().float().requires_grad_()
    HF_ROPE(x32, x32, cos.float(), sin.float())[0].backward(grad.float())
    assert torch.equal(x.grad, rotary_embedding_backward(grad, cos, sin))
    if dtype == torch.float32:
        assert torch.equal(x.grad, x32.grad)
    else:
        assert rel_error(x.grad, x32.grad) <= REL_TOL[dtype]


def test_inputs_the_kernel_does_not_take_get_the_formula(device):
    """cos of another dtype (transformers promotes to float32), an odd head dimension, cos that needs a
    gradient: the formula, with its results and gradients."""
    q, k, cos, sin = _inputs(2, 5, 4, 2, 16, torch.bfloat16, device)
    assert not _kernel_takes(q, cos.float(), sin.float(), 1)
    got = apply_rotary_pos_emb(q, k, cos.float(), sin.float())
    want = HF_ROPE(q, k, cos.float(), sin.float())
    assert got[0].dtype == torch.float32 and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    q5, k5, cos5, sin5 = _inputs(1, 3, 2, 2, 5, torch.float32, device)
    assert not _kernel_takes(q5, cos5, sin5, 1)
    assert torch.equal(apply_rotary_pos_emb(q5, k5, cos5, sin5)[0], HF_ROPE(q5, k5, cos5, sin5)[0])
    cos_g = cos.detach().float().requires_grad_()
    assert not _kernel_takes(q.float(), cos_g, sin.float(), 1)
    rotary_embedding(q.float(), cos_g, sin.float()).sum().backward()
    assert cos_g.grad is not None and torch.equal(cos_g.grad, q.float().sum(1))
    assert not _kernel_takes(q, cos, sin, 3)  # no such layout


FAMILIES = {"llama": (tm.TwellLlamaConfig, tm.TwellLlamaForCausalLM, modeling_llama),
            "qwen2": (tm.TwellQwen2Config, tm.TwellQwen2ForCausalLM, modeling_qwen2)}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_models_give_the_same_logits_and_generations(family, dtype, monkeypatch):
    config_cls, model_cls, module = FAMILIES[family]
    calls = []
    real = rope.rotary_embedding

    def counting(*args, **kwargs):
        calls.append(_kernel_takes(*args[:3], kwargs.get("unsqueeze_dim", args[3] if len(args) > 3 else 1)))
        return real(*args, **kwargs)

    monkeypatch.setattr(rope, "rotary_embedding", counting)
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**TINY_ARCH, "vocab_size": 96}, **TINY_TWELL)).to(dtype).eval()
    ids = torch.randint(0, 96, (2, 11))
    with torch.no_grad():
        want = model(ids).logits
        want_gen = model.generate(ids[:, :4], max_new_tokens=6, do_sample=False)
    try:
        assert set(fuse_rotary()) == {modeling_llama.__name__, modeling_qwen2.__name__}
        assert module.apply_rotary_pos_emb is apply_rotary_pos_emb
        assert fuse_rotary() == []  # already in place
        with torch.no_grad():
            assert torch.equal(model(ids).logits, want)
            assert len(calls) == 2 * TINY_ARCH["num_hidden_layers"] and all(calls)  # q and k of every layer, fused
            assert torch.equal(model.generate(ids[:, :4], max_new_tokens=6, do_sample=False), want_gen)
    finally:
        restored = unfuse_rotary()
    assert set(restored) == {modeling_llama.__name__, modeling_qwen2.__name__}
    assert module.apply_rotary_pos_emb is not apply_rotary_pos_emb and unfuse_rotary() == []


@pytest.mark.gpu
def test_gpu_real_shape_same_bits_and_gradient():
    """The 1.5B preset's attention shapes (32 heads of 64, 2048 positions) in bf16 on the GPU, outputs poisoned
    (fresh allocations filled with NaN would show through any position the kernel missed)."""
    dev = torch.device("cuda")
    q, k, cos, sin = _inputs(4, 2048, 32, 32, 64, torch.bfloat16, dev)
    want = HF_ROPE(q, k, cos, sin)
    poison = torch.full((64 * 2**20,), float("nan"), device=dev)
    del poison  # the caching allocator hands these NaN-filled blocks out next
    got = apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    x = q.detach().clone().requires_grad_()
    out = rotary_embedding(x, cos, sin)
    grad = torch.randn_like(out)
    out.backward(grad)
    assert torch.equal(x.grad, rotary_embedding_backward(grad, cos, sin))
