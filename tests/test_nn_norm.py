"""FusedRMSNorm / fuse_rms_norms: the transformers RMSNorm replaced by F.rms_norm, same weights, same keys."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from twell.models import TwellLlamaConfig, TwellLlamaForCausalLM
from twell.nn import FusedRMSNorm, fuse_rms_norms, unfuse_rms_norms
from twell.tolerances import FP32_ROUNDING_TOL, REL_TOL, rel_error


@pytest.mark.parametrize("cls", [LlamaRMSNorm, Qwen2RMSNorm])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matches_the_transformers_norm_forward_and_backward(cls, dtype):
    gen = torch.Generator().manual_seed(0)
    norm = cls(96, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(96, generator=gen))
    fused = FusedRMSNorm(norm, devices=("cpu", "cuda"))  # F.rms_norm on the CPU too
    assert fused.weight is norm.weight and fused.eps == 1e-5
    x = (3 * torch.randn(5, 7, 96, generator=gen)).to(dtype).requires_grad_(True)
    gy = torch.randn(5, 7, 96, generator=gen).to(dtype)
    want = norm(x)
    (gx_want, gw_want) = torch.autograd.grad(want, (x, norm.weight), gy)
    got = fused(x)
    (gx, gw) = torch.autograd.grad(got, (x, fused.weight), gy)
    assert got.dtype == want.dtype == dtype
    tol = FP32_ROUNDING_TOL if dtype == torch.float32 else REL_TOL[dtype]  # one rounding of the dtype apart
    assert rel_error(got, want) <= tol
    assert rel_error(gx, gx_want) <= 2 * tol and rel_error(gw, gw_want) <= 2 * tol


def test_mixed_dtypes_run_the_replaced_module():
    norm = LlamaRMSNorm(32)  # fp32 weight
    x = torch.randn(4, 32).to(torch.bfloat16)
    assert torch.equal(FusedRMSNorm(norm, devices=("cpu",))(x), norm(x))


def test_other_devices_run_the_replaced_module():
    norm = LlamaRMSNorm(32).to(torch.bfloat16)
    x = torch.randn(4, 32).to(torch.bfloat16)
    assert FusedRMSNorm(norm).devices == ("cuda",)
    assert torch.equal(FusedRMSNorm(norm)(x), norm(x))  # the CPU: the transformers module itself


def test_fuse_and_unfuse_a_model_in_place():
    cfg = TwellLlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, twell_backend="torch")
    model = TwellLlamaForCausalLM(cfg).eval()
    keys = list(model.state_dict())
    originals = [m for m in model.modules() if isinstance(m, LlamaRMSNorm)]
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        want = model(ids).logits
    assert fuse_rms_norms(model, devices=("cpu",)) == 5  # two per layer and the final norm
    assert not any(isinstance(m, LlamaRMSNorm) for m in model.modules())
    assert list(model.state_dict()) == keys  # same parameter names: checkpoints load either way
    with torch.no_grad():
        got = model(ids).logits
    assert rel_error(got, want) <= REL_TOL[torch.float32]
    assert unfuse_rms_norms(model) == 5
    assert [m for m in model.modules() if isinstance(m, LlamaRMSNorm)] == originals
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)


def test_bad_inputs():
    with pytest.raises(TypeError, match="no 1-D weight"):
        FusedRMSNorm(torch.nn.Linear(3, 3))
    with pytest.raises(TypeError, match="nn.Module"):
        fuse_rms_norms("model")
    with pytest.raises(TypeError, match="device type strings"):
        FusedRMSNorm(LlamaRMSNorm(8), devices="cuda")
