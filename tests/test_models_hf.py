"""Hugging Face integration: twell Llama/Qwen2 models, Auto classes, L1 loss, save/load, generate, apply/revert.

Tiny models (hidden 64, intermediate 128, 2 layers, 4 heads, vocab 128) on the CPU with the torch
backend and tile 32; nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers", reason="twell.models needs the hf extra")
pytest.importorskip("safetensors", reason="twell.models needs the hf extra")
import torch.nn.functional as F  # noqa: E402
from _helpers import TINY_ARCH, TINY_TWELL, check_gradient_checkpointing, count_sparse_calls  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import twell.models as tm  # noqa: E402
from twell.nn import DenseReluGatedMLP, DispatchPolicy, SparseGatedMLP  # noqa: E402
from twell.tolerances import L0_ABS_TOL_FP32  # noqa: E402

ARCH, TWELL = TINY_ARCH, TINY_TWELL
FAMILIES = {
    "llama": (tm.TwellLlamaConfig, tm.TwellLlamaForCausalLM, tm.TwellLlamaModel, LlamaConfig, LlamaForCausalLM),
    "qwen2": (tm.TwellQwen2Config, tm.TwellQwen2ForCausalLM, tm.TwellQwen2Model, Qwen2Config, Qwen2ForCausalLM),
}


def _twell_model(family: str, dtype: torch.dtype = torch.float32, **cfg: object) -> torch.nn.Module:
    cfg_cls, lm_cls = FAMILIES[family][0], FAMILIES[family][1]
    torch.manual_seed(0)
    return lm_cls(cfg_cls(**ARCH, **TWELL, **cfg)).to(dtype)


def _dense_twin(model: torch.nn.Module, family: str) -> torch.nn.Module:
    """The transformers model with a dense ReLU MLP and the same weights."""
    cfg_cls, lm_cls = FAMILIES[family][3], FAMILIES[family][4]
    dense = lm_cls(cfg_cls(**ARCH, hidden_act="relu")).to(model.dtype)
    dense.load_state_dict(model.state_dict())
    return dense.train(model.training)


def _ids(batch: int = 2, seq: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, ARCH["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------- config / Auto
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_auto_classes_resolve(family: str) -> None:
    cfg_cls, lm_cls, base_cls = FAMILIES[family][:3]
    cfg = AutoConfig.for_model(cfg_cls.model_type, **ARCH, **TWELL)
    assert type(cfg) is cfg_cls and cfg.hidden_act == "relu" and cfg.twell_tile == 32
    lm = AutoModelForCausalLM.from_config(cfg)
    base = AutoModel.from_config(cfg)
    assert type(lm) is lm_cls and type(base) is base_cls
    for layers in (lm.model.layers, base.layers):
        for layer in layers:
            assert isinstance(layer.mlp, SparseGatedMLP)
            assert (layer.mlp.backend, layer.mlp.tile, layer.mlp.capacity) == ("torch", 32, None)
    # The new MLPs get transformers' initialisation (normal, std = initializer_range), not nn.Linear's default.
    std = lm.model.layers[0].mlp.gate_proj.weight.std().item()
    assert abs(std - cfg.initializer_range) < 0.2 * cfg.initializer_range


def test_qwen2_keeps_attention_biases() -> None:
    model = _twell_model("qwen2")
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.k_proj.bias is not None and attn.v_proj.bias is not None
    assert all(getattr(model.model.layers[0].mlp, p).bias is None for p in ("gate_proj", "up_proj", "down_proj"))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_config_to_dict_round_trip(family: str) -> None:
    cfg_cls = FAMILIES[family][0]
    cfg = cfg_cls(**ARCH, twell_backend="torch", twell_tile=64, twell_capacity=16, twell_precision="fp32", l1_coef=3e-5)
    d = cfg.to_dict()
    assert d["model_type"] == cfg_cls.model_type
    again = cfg_cls.from_dict(d)
    for key in ("twell_backend", "twell_tile", "twell_capacity", "twell_precision", "l1_coef", "hidden_act"):
        assert getattr(again, key) == getattr(cfg, key), key


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"hidden_act": "silu"}, ValueError, "hidden_act must be 'relu'.*allow_silu"),
        ({"twell_backend": "cuda"}, ValueError, "twell_backend must be one of"),
        ({"twell_precision": "bf16"}, ValueError, "twell_precision must be one of"),
        ({"twell_backend": "auto", "twell_tile": 48}, ValueError, "Triton kernels"),
        ({"twell_tile": 0}, ValueError, "twell_tile"),
        ({"twell_tile": 32, "twell_capacity": 33}, ValueError, "twell_capacity"),
        ({"l1_coef": -1.0}, ValueError, "l1_coef"),
        ({"l1_coef": float("nan")}, ValueError, "l1_coef"),
    ],
)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_config_refuses_bad_options(family: str, kwargs: dict, exc: type, match: str) -> None:
    base = {**ARCH, **TWELL, **kwargs}
    with pytest.raises(exc, match=match):
        FAMILIES[family][0](**base)


def test_model_refuses_foreign_config() -> None:
    with pytest.raises(TypeError, match="TwellLlamaConfig"):
        tm.TwellLlamaForCausalLM(LlamaConfig(**ARCH, hidden_act="relu"))
    with pytest.raises(TypeError, match="TwellQwen2Config"):
        tm.TwellQwen2Model(tm.TwellLlamaConfig(**ARCH, **TWELL))


# ---------------------------------------------------------------------------------------------- training: L1 term
def _manual_l1_hooks(model: torch.nn.Module) -> tuple[list[torch.Tensor], list]:
    """Forward hooks collecting each MLP's differentiable L1 term and l0 from its input (the published formulas)."""
    l1s: list[torch.Tensor] = []
    l0s: list[torch.Tensor] = []

    def hook(mod: torch.nn.Module, args: tuple, _out: torch.Tensor) -> None:
        x = args[0].reshape(-1, mod.gate_proj.weight.shape[1])
        a = F.relu(F.linear(x, mod.gate_proj.weight))
        h = a * F.linear(x, mod.up_proj.weight)
        l1s.append(h.abs().sum(-1).mean())
        l0s.append((a != 0).sum(-1).double().mean())

    handles = [layer.mlp.register_forward_hook(hook) for layer in model.model.layers]
    return l1s, [l0s, handles]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_training_loss_adds_l1_and_matches_dense_gradients(family: str) -> None:
    coef = 0.01  # large enough that the term is visible next to the LM loss
    model = _twell_model(family, torch.float64, l1_coef=coef).train()
    dense = _dense_twin(model, family)
    ids = _ids()

    out = model(input_ids=ids, labels=ids)
    assert isinstance(out, tm.TwellCausalLMOutput)

    l1s, (l0s, handles) = _manual_l1_hooks(dense)
    ref = dense(input_ids=ids, labels=ids)
    for h in handles:
        h.remove()
    # transformers' LM loss upcasts the logits to float32; the L1 term is added in the loss's dtype.
    ce = F.cross_entropy(ref.logits[:, :-1].float().reshape(-1, ARCH["vocab_size"]), ids[:, 1:].reshape(-1))
    l1 = torch.stack(l1s).mean()
    total = ref.loss + coef * l1.to(ref.loss.dtype)

    torch.testing.assert_close(out.logits, ref.logits)
    torch.testing.assert_close(ref.loss, ce)
    torch.testing.assert_close(out.l1_loss, l1)
    assert out.loss.dtype == ref.loss.dtype
    torch.testing.assert_close(out.loss, total)
    assert out.layer_l0.shape == (ARCH["num_hidden_layers"],) and out.layer_l0.dtype == torch.float32
    torch.testing.assert_close(out.layer_l0.double(), torch.stack(l0s), atol=L0_ABS_TOL_FP32, rtol=0)

    out.loss.backward()
    total.backward()
    for (name, p), p_ref in zip(model.named_parameters(), dense.parameters(), strict=True):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, p_ref.grad, msg=lambda m, n=name: f"{n}: {m}")


def test_l1_not_added_when_coef_zero_or_eval() -> None:
    model = _twell_model("llama", torch.float64, l1_coef=0.0).train()
    ids = _ids()
    out = model(input_ids=ids, labels=ids)
    ce = F.cross_entropy(out.logits[:, :-1].float().reshape(-1, ARCH["vocab_size"]), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, ce)
    assert out.l1_loss is not None and out.l1_loss.requires_grad  # still exposed for logging

    model.config.l1_coef = 0.5
    model.eval()
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    ce = F.cross_entropy(out.logits[:, :-1].float().reshape(-1, ARCH["vocab_size"]), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, ce)
    assert out.l1_loss is None
    assert torch.isfinite(out.layer_l0).all()  # the first inference call measures l0 in every layer


def test_training_without_labels_and_tuple_output() -> None:
    model = _twell_model("llama").train()
    ids = _ids()
    out = model(input_ids=ids)
    assert out.loss is None and out.l1_loss is not None
    out.l1_loss.backward()
    assert model.model.layers[0].mlp.gate_proj.weight.grad is not None
    tup = model(input_ids=ids, labels=ids, return_dict=False)
    assert isinstance(tup, tuple) and tup[0].dim() == 0 and tup[1].shape == (2, 7, ARCH["vocab_size"])


def test_missing_l1_in_training_is_an_error() -> None:
    """A training forward where the MLPs ran without grad (reentrant checkpointing does that) must not drop L1."""
    model = _twell_model("llama").train()
    model.model.layers[0].mlp.register_forward_pre_hook(lambda mod, args: mod.eval() and None)
    model.model.layers[0].mlp.register_forward_hook(lambda mod, args, out: mod.train() and None)
    with pytest.raises(RuntimeError, match="produced no L1 term"):
        model(input_ids=_ids(), labels=_ids())


@pytest.mark.filterwarnings("ignore::FutureWarning")  # renamed activation_checkpointing_enable in late 5.x
def test_gradient_checkpointing() -> None:
    """Non-reentrant checkpointing (the default) keeps the L1 term; reentrant runs the MLPs without grad: refused."""
    check_gradient_checkpointing(_twell_model("llama", torch.float64, l1_coef=0.01).train(), _ids())


# ---------------------------------------------------------------------------------------------- save / load
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_save_load_round_trip(family: str, tmp_path) -> None:
    model = _twell_model(family, l1_coef=3e-5).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == FAMILIES[family][0].model_type and cfg["twell_tile"] == 32
    # Ordinary dense safetensors with the transformers model's own keys.
    saved = load_file(str(tmp_path / "model.safetensors"))
    dense_keys = set(_dense_twin(model, family).state_dict())
    assert set(saved) <= dense_keys and dense_keys - set(saved) <= {"lm_head.weight"}

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    assert (loaded.config.twell_backend, loaded.config.twell_tile, loaded.config.l1_coef) == ("torch", 32, 3e-5)
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    # The dense transformers class reads the same weights.
    dense = FAMILIES[family][4].from_pretrained(tmp_path, config=FAMILIES[family][3](**ARCH, hidden_act="relu"))
    with torch.no_grad():
        assert torch.equal(dense.eval()(ids).logits, model(ids).logits)


# ---------------------------------------------------------------------------------------------- generate
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_generate_matches_dense_relu_model(family: str) -> None:
    model = _twell_model(family).eval()
    dense = _dense_twin(model, family).eval()
    ids = _ids(2, 5)
    kw = {"max_new_tokens": 8, "do_sample": False, "use_cache": True, "pad_token_id": 0}
    with torch.no_grad():
        got = model.generate(ids, **kw)
        want = dense.generate(ids, **kw)
    assert got.shape[1] > ids.shape[1]
    assert torch.equal(got, want)


def test_generate_with_sparse_path_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _twell_model("llama", torch.float64).eval()
    dense = _dense_twin(model, "llama").eval()
    assert tm.set_dispatch_policy(model, DispatchPolicy.always_sparse()) == ARCH["num_hidden_layers"]
    calls = count_sparse_calls(monkeypatch)
    ids = _ids(2, 5)
    kw = {"max_new_tokens": 6, "do_sample": False, "use_cache": True, "pad_token_id": 0}
    with torch.no_grad():
        got = model.generate(ids, **kw)
        want = dense.generate(ids, **kw)
        torch.testing.assert_close(model(got).logits, dense(got).logits)
    assert torch.equal(got, want)
    # Prefill + one call per new token after it, in each layer.
    assert len(calls) >= ARCH["num_hidden_layers"] * kw["max_new_tokens"]
    with pytest.raises(TypeError, match="DispatchPolicy"):
        tm.set_dispatch_policy(model, "sparse")


# ---------------------------------------------------------------------------------------------- apply / revert
def _hf_model(family: str, hidden_act: str, dtype: torch.dtype = torch.float32, **extra: object) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg_cls, lm_cls = FAMILIES[family][3], FAMILIES[family][4]
    return lm_cls(cfg_cls(**ARCH, hidden_act=hidden_act, **extra)).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_apply_relu_model_is_exact_and_revert_restores(family: str, dtype: torch.dtype) -> None:
    model = _hf_model(family, "relu", dtype)
    ids = _ids()
    with torch.no_grad():
        before = model(ids).logits
    keys = list(model.state_dict())
    mlp0 = model.model.layers[0].mlp
    w0 = mlp0.gate_proj.weight

    report = tm.apply(model, backend="torch", tile=32)
    n = ARCH["num_hidden_layers"]
    assert report.names == [f"model.layers.{i}.mlp" for i in range(n)]
    assert report.shapes == {name: (64, 128) for name in report.names}
    assert report.original_activations == {"relu"} and not report.activation_changed
    assert "2 MLP module(s) converted" in str(report) and "hidden=64, intermediate=128" in str(report)
    assert all(isinstance(layer.mlp, SparseGatedMLP) for layer in model.model.layers)
    assert model.model.layers[0].mlp.gate_proj.weight is w0  # shared, not copied
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)  # dense dispatch: bit-identical
        tm.set_dispatch_policy(model, DispatchPolicy.always_sparse())
        torch.testing.assert_close(model(ids).logits, before)

    back = tm.revert(model)
    assert back.direction == "revert" and len(back) == n
    assert model.model.layers[0].mlp is mlp0 and mlp0.gate_proj.weight is w0
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    with pytest.raises(ValueError, match="no SparseGatedMLP"):
        tm.revert(model)


def test_apply_then_train_then_revert_keeps_training() -> None:
    model = _hf_model("llama", "relu").train()
    tm.apply(model, backend="torch", tile=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = _ids()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    w = model.model.layers[1].mlp.down_proj.weight.detach().clone()
    tm.revert(model)
    assert torch.equal(model.model.layers[1].mlp.down_proj.weight, w)
    assert model.model.layers[1].mlp.training


def test_revert_without_record_gives_dense_relu_mlp() -> None:
    model = _twell_model("llama").eval()
    ids = _ids()
    with torch.no_grad():
        before = model(ids).logits
    report = tm.revert(model)
    assert {m.new_class for m in report.modules} == {"DenseReluGatedMLP"}
    assert all(isinstance(layer.mlp, DenseReluGatedMLP) for layer in model.model.layers)
    with torch.no_grad():
        out = model(ids)
        assert torch.equal(out.logits, before) and out.layer_l0 is None
    # ... and back again: DenseReluGatedMLP is a ReLU MLP apply accepts.
    again = tm.apply(model, backend="torch", tile=32)
    assert again.original_activations == {"relu"}


def test_top_level_apply_and_revert_are_the_models_ones() -> None:
    import twell

    assert twell.apply is tm.apply and twell.revert is tm.revert
    with pytest.raises(AttributeError, match="no attribute 'aply'"):
        twell.aply  # noqa: B018


def test_apply_refuses_silu_and_leaves_model_untouched() -> None:
    model = _hf_model("llama", "silu")
    with pytest.raises(ValueError, match=r"'silu' in 2 module\(s\).*allow_silu=True"):
        tm.apply(model)
    assert type(model.model.layers[0].mlp).__name__ == "LlamaMLP"


def test_apply_allow_silu_switches_to_relu_and_revert_restores() -> None:
    model = _hf_model("llama", "silu")
    relu_ref = _hf_model("llama", "relu")  # same seed: same weights
    ids = _ids()
    with torch.no_grad():
        silu_logits = model(ids).logits
        relu_logits = relu_ref(ids).logits
    report = tm.apply(model, allow_silu=True, backend="torch", tile=32)
    assert report.activation_changed and report.original_activations == {"silu"}
    assert any("replaced by ReLU" in n for n in report.notes) and "note:" in str(report)
    assert model.config.hidden_act == "relu"
    with torch.no_grad():
        assert torch.equal(model(ids).logits, relu_logits)
    back = tm.revert(model)
    assert model.config.hidden_act == "silu" and {m.activation for m in back.modules} == {"silu"}
    with torch.no_grad():
        assert torch.equal(model(ids).logits, silu_logits)


def test_apply_bad_inputs() -> None:
    with pytest.raises(TypeError, match="torch.nn.Module"):
        tm.apply("model")
    with pytest.raises(TypeError, match="allow_silu must be a bool"):
        tm.apply(_hf_model("llama", "relu"), allow_silu="yes")
    with pytest.raises(TypeError, match="unexpected keyword argument.*dtype"):
        tm.apply(_hf_model("llama", "relu"), dtype=torch.float16)
    with pytest.raises(ValueError, match="no gated MLP"):
        tm.apply(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with pytest.raises(ValueError, match="SparseGatedMLP already present"):
        tm.apply(_twell_model("llama"))
    with pytest.raises(ValueError, match="has a bias"):
        tm.apply(_hf_model("llama", "relu", mlp_bias=True))
    with pytest.raises(ValueError, match="'gelu_pytorch_tanh'.*Only ReLU"):
        tm.apply(_hf_model("llama", "gelu_pytorch_tanh"), allow_silu=True)
    with pytest.raises(ValueError, match="tile"):
        tm.apply(_hf_model("llama", "relu"), backend="auto", tile=48)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        tm.revert(None)
