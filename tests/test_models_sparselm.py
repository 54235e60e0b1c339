"""Loading SparseLM-style checkpoints: each supported layout, written here as a tiny checkpoint, loads exactly.

The reference is a transformers ``LlamaForCausalLM`` with a ReLU MLP and tied embeddings (the published
architecture, scaled down); every layout is written from its state dict and must give its logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="twell.models needs the hf extra")
pytest.importorskip("safetensors", reason="twell.models needs the hf extra")
from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import twell.models as tm  # noqa: E402
from twell.nn import SparseGatedMLP  # noqa: E402
from twell.tolerances import FP32_ELEMENT_TOL  # noqa: E402

ARCH = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def _published_config(**extra: object) -> dict:
    """A config.json in the form the authors' SparseLlamaConfig writes (transformers 4.x style rope keys)."""
    return {
        **ARCH,
        "architectures": ["SparseLlamaForCausalLM"],
        "model_type": "llama_sparse_relu",
        "hidden_act": "silu",  # what their training configs say; the sparse MLP computes ReLU regardless
        "rope_theta": 100000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        "transformers_version": "4.57.0",
        "sparsity_l1_coeff": 2e-5,
        "sparsity_gated_mlp": True,
        "sparsity_new_intermediate_size": 128,
        "sparsity_use_hybrid_kernel": False,
        **extra,
    }


@pytest.fixture(scope="module")
def reference() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(**ARCH, hidden_act="relu", rope_theta=100000.0)
    return LlamaForCausalLM(cfg).eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, ARCH["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(3))


def _layout_state(ref: LlamaForCausalLM, layout: str) -> dict[str, torch.Tensor]:
    sd = {k: v.detach().clone().contiguous() for k, v in ref.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if ".mlp." not in k:
            out[k] = v
            continue
        prefix, name = k.rsplit(".mlp.", 1)
        prefix += ".mlp."
        part = name.split("_")[0]  # gate / up / down
        if layout in ("hf", "sharded", "bin", "prefixed", "base-model-keys"):
            out[k] = v
        elif layout == "hf-down-t":
            out[k] = v.t().contiguous() if part == "down" else v
        elif layout == "twell":
            out[prefix + part.upper()] = v.t().contiguous() if part == "down" else v
        elif layout == "einsum":
            out[prefix + part + "_weight"] = v if part == "up" else v.t().contiguous()
        elif layout == "fused-gate-up":
            if part == "down":
                out[k] = v
            elif part == "gate":
                out[prefix + "gate_up_proj.weight"] = torch.cat([v, sd[prefix + "up_proj.weight"]])
        else:
            raise AssertionError(layout)
    if layout == "prefixed":
        out = {"module." + k: v for k, v in out.items() if k != "lm_head.weight"}
        out["module.tracker._dummy"] = torch.zeros(1)
        out["module.model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    if layout == "base-model-keys":
        out = {k.removeprefix("model."): v for k, v in out.items() if k != "lm_head.weight"}
    return out


def _write(path: Path, state: dict[str, torch.Tensor], config: dict, layout: str = "hf") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if layout == "sharded":
        keys = sorted(state)
        half = len(keys) // 2
        shards = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
        for fname, ks in shards.items():
            save_file({k: state[k] for k in ks}, str(path / fname))
        index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
    elif layout == "bin":
        torch.save(state, path / "pytorch_model.bin")
    else:
        save_file(state, str(path / "model.safetensors"))
    return path


LAYOUTS = ["hf", "hf-down-t", "twell", "einsum", "fused-gate-up", "prefixed", "base-model-keys", "sharded", "bin"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_load_each_layout(layout: str, reference: LlamaForCausalLM, tmp_path: Path) -> None:
    path = _write(tmp_path / layout, _layout_state(reference, layout), _published_config(), layout)
    model = tm.load_sparselm(path, twell_backend="torch", twell_tile=32)
    assert isinstance(model, tm.TwellLlamaForCausalLM) and not model.training
    assert all(isinstance(layer.mlp, SparseGatedMLP) for layer in model.model.layers)
    assert model.config.hidden_act == "relu" and model.config.l1_coef == 2e-5
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    expected = {"sharded": "hf", "bin": "hf", "prefixed": "hf"}.get(layout, layout)
    assert expected in model.config.twell_source_layout.split(",")
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


def test_load_dtype_and_overrides(reference: LlamaForCausalLM, tmp_path: Path) -> None:
    path = _write(tmp_path, _layout_state(reference, "hf"), _published_config())
    model = tm.load_sparselm(path, dtype=torch.float64, twell_backend="torch", twell_tile=64, l1_coef=0.0)
    assert model.dtype == torch.float64 and model.config.l1_coef == 0.0
    assert model.model.layers[0].mlp.tile == 64
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits.float(), reference(ids).logits,
                                   rtol=FP32_ELEMENT_TOL, atol=FP32_ELEMENT_TOL)


def test_plain_llama_config_needs_relu(reference: LlamaForCausalLM, tmp_path: Path) -> None:
    cfg = {k: v for k, v in _published_config(model_type="llama").items() if not k.startswith("sparsity_")}
    path = _write(tmp_path, _layout_state(reference, "hf"), cfg)
    with pytest.raises(ValueError, match="hidden_act='silu'.*force_relu=True"):
        tm.load_sparselm(path, twell_backend="torch", twell_tile=32)
    model = tm.load_sparselm(path, force_relu=True, twell_backend="torch", twell_tile=32)
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, reference(_ids()).logits)
    cfg["hidden_act"] = "relu"
    path = _write(tmp_path / "relu", _layout_state(reference, "hf"), cfg)
    assert tm.load_sparselm(path, twell_backend="torch", twell_tile=32).config.hidden_act == "relu"


def test_mismatched_keys_are_listed(reference: LlamaForCausalLM, tmp_path: Path) -> None:
    state = _layout_state(reference, "hf")
    del state["model.layers.1.self_attn.o_proj.weight"]
    state["model.layers.0.mlp.experts.weight"] = torch.zeros(2, 2)
    state["model.extra_head.weight"] = torch.zeros(2, 2)
    path = _write(tmp_path, state, _published_config())
    with pytest.raises(ValueError) as info:
        tm.load_sparselm(path, twell_backend="torch", twell_tile=32)
    msg = str(info.value)
    assert "model.layers.0.mlp.experts.weight" in msg and "model.extra_head.weight" in msg
    assert "Missing keys: ['model.layers.1.self_attn.o_proj.weight']" in msg and "layout(s): hf" in msg


def test_bad_shapes_and_duplicates(reference: LlamaForCausalLM, tmp_path: Path) -> None:
    state = _layout_state(reference, "hf")
    state["model.layers.0.mlp.gate_proj.weight"] = torch.zeros(100, 64)
    with pytest.raises(ValueError, match=r"gate_proj.weight has shape \(100, 64\)"):
        tm.load_sparselm(_write(tmp_path / "a", state, _published_config()), twell_backend="torch", twell_tile=32)
    state = _layout_state(reference, "hf")
    state["model.layers.0.mlp.GATE"] = state["model.layers.0.mlp.gate_proj.weight"].clone()
    with pytest.raises(ValueError, match="two gate weights"):
        tm.load_sparselm(_write(tmp_path / "b", state, _published_config()), twell_backend="torch", twell_tile=32)
    state = _layout_state(reference, "hf")
    state["model.norm.weight"] = torch.ones(32)
    with pytest.raises(ValueError, match="shapes do not match"):
        tm.load_sparselm(_write(tmp_path / "c", state, _published_config()), twell_backend="torch", twell_tile=32)
    # Config and weights disagree on the width: reported as a shape problem, not loaded.
    with pytest.raises(ValueError, match="expected"):
        tm.load_sparselm(
            _write(
                tmp_path / "d", _layout_state(reference, "hf"), _published_config(sparsity_new_intermediate_size=96)
            ),
            twell_backend="torch",
            twell_tile=32,
        )


def test_bad_paths_and_configs(reference: LlamaForCausalLM, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a local directory.*never fetches"):
        tm.load_sparselm("SakanaAI/SparseLM1.5B")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        tm.load_sparselm(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text(json.dumps(_published_config()))
    with pytest.raises(FileNotFoundError, match="no weights.*config.json"):
        tm.load_sparselm(tmp_path / "empty", twell_backend="torch", twell_tile=32)
    with pytest.raises(ValueError, match="model_type 'qwen2'"):
        tm.sparselm_config_from_dict(_published_config(model_type="qwen2"))
    with pytest.raises(ValueError, match="non-gated"):
        tm.sparselm_config_from_dict(_published_config(sparsity_gated_mlp=False))
    with pytest.raises(ValueError, match="mlp_bias"):
        tm.sparselm_config_from_dict(_published_config(mlp_bias=True))
    with pytest.raises(TypeError, match="mapping"):
        tm.sparselm_config_from_dict("config.json")
    path = _write(tmp_path / "ok", _layout_state(reference, "hf"), _published_config())
    with pytest.raises(TypeError, match="dtype"):
        tm.load_sparselm(path, dtype=torch.int8)


def test_published_shapes_config() -> None:
    cfg = tm.sparselm_config("1.5B", twell_backend="torch")
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.head_dim) == (2048, 5632, 32, 64)
    assert cfg.num_hidden_layers == 28 and cfg.vocab_size == 49152 and cfg.tie_word_embeddings
    assert [tm.SPARSELM_LAYERS[s] for s in ("0.5B", "1B", "1.5B", "2B")] == [8, 18, 28, 38]
    with pytest.raises(ValueError, match="size must be one of"):
        tm.sparselm_config("7B")
