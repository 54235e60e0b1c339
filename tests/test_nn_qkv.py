"""fuse_qkv / unfuse_qkv: an attention layer's q, k and v projections as one GEMM, same parameters and keys."""

from __future__ import annotations

import pytest
import torch

from twell.models import TwellLlamaConfig, TwellLlamaForCausalLM, TwellQwen2Config, TwellQwen2ForCausalLM
from twell.nn import fuse_qkv, qkv_fused, unfuse_qkv
from twell.tolerances import FP32_ROUNDING_TOL, REL_TOL, REL_TOL_GRAD, rel_error

KW = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
          twell_backend="torch")


def _models():
    torch.manual_seed(0)
    return [TwellLlamaForCausalLM(TwellLlamaConfig(num_key_value_heads=2, **KW)),  # GQA: k, v narrower than q
            TwellQwen2ForCausalLM(TwellQwen2Config(num_key_value_heads=4, **KW))]  # q, k, v with biases


@pytest.mark.parametrize("model", _models(), ids=["llama-gqa", "qwen2-bias"])
def test_forward_backward_and_keys(model):
    ids = torch.randint(0, 64, (2, 9))
    keys = list(model.state_dict())
    model.eval()
    with torch.no_grad():
        want = model(ids).logits
    model.zero_grad()
    model(ids).logits.square().mean().backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert not qkv_fused(model)
    assert fuse_qkv(model) == 2 and qkv_fused(model)
    assert fuse_qkv(model) == 0  # already fused
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        assert rel_error(model(ids).logits, want) <= REL_TOL[torch.float32]
        assert rel_error(model(ids).logits, want) <= REL_TOL[torch.float32]  # the cached stacked weight, reused
    with torch.inference_mode():
        assert rel_error(model(ids).logits, want) <= REL_TOL[torch.float32]  # inference tensors have no version counter
    model.zero_grad()
    model(ids).logits.square().mean().backward()  # gradients reach the three projections' own parameters
    for n, p in model.named_parameters():
        if n in want_grads:
            assert rel_error(p.grad, want_grads[n]) <= REL_TOL_GRAD[torch.float32], n
    q = model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        q.weight.mul_(2)  # a changed weight: the stacked copy is rebuilt
        changed = model(ids).logits
        unfuse = unfuse_qkv(model)
        assert unfuse == 2 and not qkv_fused(model)
        assert rel_error(changed, model(ids).logits) <= REL_TOL[torch.float32]


def test_a_lone_call_runs_the_modules_own_linear():
    model = _models()[0]
    fuse_qkv(model)
    attn = model.model.layers[0].self_attn
    x = torch.randn(3, 32)
    with torch.no_grad():
        for proj in (attn.k_proj, attn.v_proj, attn.q_proj, attn.k_proj):
            assert torch.allclose(proj(x), torch.nn.functional.linear(x, proj.weight, proj.bias),
                                  atol=FP32_ROUNDING_TOL)
        y = x.clone()
        attn.q_proj(x)
        assert torch.allclose(attn.k_proj(y), torch.nn.functional.linear(y, attn.k_proj.weight), atol=FP32_ROUNDING_TOL)


def test_bad_inputs():
    with pytest.raises(TypeError, match="nn.Module"):
        fuse_qkv("model")
    attn = torch.nn.Module()
    attn.q_proj, attn.k_proj, attn.v_proj = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(5, 4)
    with pytest.raises(ValueError, match="share their input width"):
        fuse_qkv(attn)


def test_a_deep_copy_uses_its_own_weights():
    import copy

    model = _models()[0].eval()
    ids = torch.randint(0, 64, (2, 9))
    fuse_qkv(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
        assert qkv_fused(twin)
        q = twin.model.layers[0].self_attn.q_proj
        assert q._twell_qkv_group.linears[0] is q
        got = twin(ids).logits
        unfuse_qkv(twin)
        assert rel_error(got, twin(ids).logits) <= REL_TOL[torch.float32]


@pytest.mark.gpu
def test_gpu_bf16_fused_projections_match():
    torch.manual_seed(0)
    cfg = TwellLlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1408, num_hidden_layers=2,
                           num_attention_heads=8, num_key_value_heads=8)
    model = TwellLlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 512, (4, 256), device="cuda")
    with torch.inference_mode():
        want = model.model(input_ids=ids).last_hidden_state
        fuse_qkv(model)
        got = model.model(input_ids=ids).last_hidden_state
    assert rel_error(got, want) <= REL_TOL[torch.bfloat16]
