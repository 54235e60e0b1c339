"""Loading the published SparseLM checkpoints (Sakana AI / NVIDIA, "Sparser, Faster, Lighter Transformer
Language Models", 2026) from a local directory into :class:`~twell.models.TwellLlamaForCausalLM`.

The models (``SakanaAI/SparseLM0.5B``, ``1B``, ``1.5B``, ``2B``) are Llama-style: hidden 2048, FFN 5632,
32 heads of 64 (no GQA), vocab 49152, tied embeddings, no biases, RMSNorm, ReLU-gated FFN; 8, 18, 28
and 38 layers.  Nothing is downloaded here: fetch the repository first (e.g. ``huggingface-cli
download SakanaAI/SparseLM1.5B --local-dir DIR``) and pass ``DIR``.

**What the published layout is, and what is assumed.**  From the authors' public training code
(github.com/SakanaAI/sparser-faster-llms, ``custom_models/sparse_models.py`` and
``sparse_testing_utils.py``; read, not copied):

* ``config.json`` is written by their ``SparseLlamaConfig``: ``model_type`` ``"llama_sparse_relu"``,
  the LlamaConfig fields, and ``sparsity_*`` options (``sparsity_l1_coeff``, ``sparsity_gated_mlp``,
  ``sparsity_new_intermediate_size``, ``sparsity_use_hybrid_kernel`` ...).  Their training configs set
  ``hidden_act: silu`` although the sparse MLP always computes ReLU, so **``hidden_act`` is not trusted
  when the config carries those markers**: it is overridden to ``"relu"``.  A plain ``"llama"`` config
  with a non-ReLU ``hidden_act`` is refused unless ``force_relu=True``.
* The weights are an HF Llama state dict (``model.layers.{i}.mlp.gate_proj.weight`` ...), possibly with
  training-side extras (``tracker.*``, ``metrics_accumulator.*``), which are dropped.

Since the exact files of the hub repositories could not be inspected offline, the loader also accepts
these variants (each an **assumption** derived from the layouts that code converts between), detected
per key, and reports which one it found:

===================  ========================================================================
layout               MLP keys under ``model.layers.{i}.mlp.``
===================  ========================================================================
``hf``               ``gate_proj.weight`` [F, d], ``up_proj.weight`` [F, d], ``down_proj.weight`` [d, F]
``hf-down-t``        as ``hf`` but ``down_proj.weight`` stored [F, d] (their hybrid training kernel
                     transposes it in place, so a checkpoint saved from it has that shape)
``twell``            ``GATE`` [F, d], ``UP`` [F, d], ``DOWN`` [F, d] (= Wd^T; their TwELL kernel layout)
``einsum``           ``gate_weight`` [d, F], ``up_weight`` [F, d], ``down_weight`` [F, d]
``fused-gate-up``    ``gate_up_proj.weight`` [2F, d] (gate rows first, then up) and ``down_proj.weight``
===================  ========================================================================

Orientation is decided from the shapes whenever F != d (true of every published model), so a
transposed tensor under any of these names is accepted; only for F == d is the table's convention
used.  Outside the MLP the keys must be the HF Llama ones, possibly with a wrapper prefix (``module.``,
``_orig_mod.``) or without the ``model.`` prefix (a saved ``LlamaModel``); ``lm_head.weight`` is
dropped when the embeddings are tied.  Anything else raises a ``ValueError`` listing the unexpected
and missing keys.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .llama import TwellLlamaConfig, TwellLlamaForCausalLM

__all__ = [
    "SPARSELM_LAYERS",
    "convert_sparselm_state_dict",
    "load_sparselm",
    "load_state_dict_files",
    "sparselm_config",
    "sparselm_config_from_dict",
]

logger = logging.getLogger(__name__)

#: Layers of each published size (all share the shapes of :data:`SPARSELM_ARCH`).
SPARSELM_LAYERS: dict[str, int] = {"0.5B": 8, "1B": 18, "1.5B": 28, "2B": 38}

#: The shared architecture of the published models (from the paper and the authors' training configs).
SPARSELM_ARCH: dict[str, Any] = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "max_position_embeddings": 2048,
    "bos_token_id": 0,
    "eos_token_id": 0,
}

_ACCEPTED_MODEL_TYPES = ("llama", "llama_sparse_relu", "twell_llama")
#: config.json keys that describe the file or the authors' training setup, not the network.
_META_KEYS = ("model_type", "architectures", "auto_map", "transformers_version", "_name_or_path")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
_AUX_MARKERS = ("tracker.", "metrics_accumulator.")
_MLP_KEY = re.compile(r"^model\.layers\.(\d+)\.mlp\.(.+)$")

# suffix -> (part, layout, stored transposed relative to nn.Linear's [out, in])
_MLP_SUFFIXES: dict[str, tuple[str, str, bool]] = {
    "gate_proj.weight": ("gate", "hf", False),
    "up_proj.weight": ("up", "hf", False),
    "down_proj.weight": ("down", "hf", False),
    "GATE": ("gate", "twell", False),
    "UP": ("up", "twell", False),
    "DOWN": ("down", "twell", True),
    "gate_weight": ("gate", "einsum", True),
    "up_weight": ("up", "einsum", False),
    "down_weight": ("down", "einsum", True),
    "gate_up_proj.weight": ("gate_up", "fused-gate-up", False),
}


# ---------------------------------------------------------------------------------------------- config
def sparselm_config(size: str = "1.5B", **overrides: Any) -> TwellLlamaConfig:
    """The :class:`TwellLlamaConfig` of a published SparseLM size (``"0.5B"``, ``"1B"``, ``"1.5B"``, ``"2B"``).

    For benchmarks and tests with the real shapes but no checkpoint; ``overrides`` win over the defaults.
    """
    if size not in SPARSELM_LAYERS:
        raise ValueError(f"size must be one of {', '.join(SPARSELM_LAYERS)}; got {size!r}")
    return TwellLlamaConfig(**{**SPARSELM_ARCH, "num_hidden_layers": SPARSELM_LAYERS[size], **overrides})


def sparselm_config_from_dict(
    raw: Mapping[str, Any], *, force_relu: bool = False, **overrides: Any
) -> TwellLlamaConfig:
    """A :class:`TwellLlamaConfig` from a SparseLM (or plain Llama) ``config.json`` dict; see the module docs.

    ``overrides`` (e.g. ``twell_backend="torch"``, ``l1_coef=0``) are applied last.
    """
    if not isinstance(raw, Mapping):
        raise TypeError(f"the config must be a mapping (the parsed config.json), got {type(raw).__name__}")
    model_type = raw.get("model_type", "llama")
    if model_type not in _ACCEPTED_MODEL_TYPES:
        raise ValueError(
            f"config.json has model_type {model_type!r}; load_sparselm reads Llama-family SparseLM checkpoints "
            f"({', '.join(map(repr, _ACCEPTED_MODEL_TYPES))})"
        )
    marked = model_type == "llama_sparse_relu" or any(k.startswith("sparsity_") for k in raw)
    if raw.get("sparsity_gated_mlp", True) is False:
        raise ValueError(
            "config.json has sparsity_gated_mlp=false (a non-gated ReLU MLP); twell implements the gated FFN only"
        )
    if raw.get("mlp_bias", False):
        raise ValueError("config.json has mlp_bias=true; the sparse FFN has no biases")
    cfg = {k: v for k, v in raw.items() if k not in _META_KEYS and not k.startswith("sparsity_")}
    if raw.get("sparsity_new_intermediate_size") is not None:
        # The authors' MLP is built with this width when set (it overrides intermediate_size).
        cfg["intermediate_size"] = int(raw["sparsity_new_intermediate_size"])
    if "l1_coef" not in cfg and raw.get("sparsity_l1_coeff") is not None:
        cfg["l1_coef"] = float(raw["sparsity_l1_coeff"])
    act = cfg.get("hidden_act", "relu")
    if act != "relu":
        if not (marked or force_relu):
            raise ValueError(
                f"config.json has hidden_act={act!r} and no SparseLM markers (model_type 'llama_sparse_relu' or "
                "sparsity_* keys); if the checkpoint was trained with a ReLU gate pass force_relu=True, otherwise "
                "use twell.models.apply(model, allow_silu=True) on the dense model for sparse fine-tuning"
            )
        logger.info("SparseLM config says hidden_act=%r; its MLPs compute ReLU, so hidden_act is set to 'relu'", act)
        cfg["hidden_act"] = "relu"
    cfg.update(overrides)
    return TwellLlamaConfig(**cfg)


# ---------------------------------------------------------------------------------------------- weights
def load_state_dict_files(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint in directory ``path`` (CPU): single or sharded safetensors, else .bin.

    ``.bin`` files are read with ``torch.load(weights_only=True)`` (no arbitrary code is executed).
    """
    from safetensors.torch import load_file

    root = Path(path)
    candidates = [
        ("model.safetensors.index.json", True, True),
        ("model.safetensors", False, True),
        ("pytorch_model.bin.index.json", True, False),
        ("pytorch_model.bin", False, False),
    ]
    for fname, sharded, is_st in candidates:
        f = root / fname
        if not f.is_file():
            continue
        files = sorted(set(json.loads(f.read_text())["weight_map"].values())) if sharded else [fname]
        state: dict[str, torch.Tensor] = {}
        for shard in files:
            sp = root / shard
            if not sp.is_file():
                raise FileNotFoundError(f"{f} names the shard {shard}, which is not in {root}")
            part = load_file(str(sp)) if is_st else torch.load(sp, map_location="cpu", weights_only=True)
            state.update(part)
        return state
    present = sorted(p.name for p in root.iterdir())
    raise FileNotFoundError(
        f"no weights in {root}: expected model.safetensors, model.safetensors.index.json, pytorch_model.bin or "
        f"pytorch_model.bin.index.json; the directory holds {present}"
    )


def _strip_wrappers(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for p in _WRAPPER_PREFIXES:
            if key.startswith(p):
                key, changed = key[len(p) :], True
    return key


def _orient(t: torch.Tensor, target: tuple[int, int], transposed_by_convention: bool, key: str) -> torch.Tensor:
    """``t`` as an nn.Linear weight of shape ``target``; transposed when its shape (if square: its name) says so."""
    if t.dim() != 2:
        raise ValueError(f"{key} has shape {tuple(t.shape)}; expected a matrix of shape {target} or its transpose")
    shape = tuple(t.shape)
    if target[0] != target[1]:
        if shape == target:
            return t
        if shape == target[::-1]:
            return t.t().contiguous()
    elif shape == target:
        return t.t().contiguous() if transposed_by_convention else t
    raise ValueError(f"{key} has shape {shape}; expected {target} or its transpose {target[::-1]}")


def convert_sparselm_state_dict(
    state: Mapping[str, torch.Tensor], config: TwellLlamaConfig
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Map a SparseLM state dict onto :class:`TwellLlamaForCausalLM`'s keys; return it and the layouts found.

    Raises ``ValueError`` listing unexpected and missing keys (and the layouts detected) when the
    checkpoint does not fit the model ``config`` describes, and on shape mismatches.
    """
    d, f = config.hidden_size, config.intermediate_size
    out: dict[str, torch.Tensor] = {}
    layouts: set[str] = set()
    parts: dict[tuple[int, str], tuple[str, torch.Tensor]] = {}
    unexpected: list[str] = []

    keys = {_strip_wrappers(k): k for k in state}
    if len(keys) != len(state):
        raise ValueError("the checkpoint has keys that differ only by a wrapper prefix (module., _orig_mod.)")
    if not any(k.startswith("model.") for k in keys) and any(k.startswith(("layers.", "embed_tokens.")) for k in keys):
        keys = {(k if k.startswith("lm_head.") else "model." + k): v for k, v in keys.items()}
        layouts.add("base-model-keys")

    for key, orig_key in keys.items():
        t = state[orig_key]
        if any(m in key for m in _AUX_MARKERS) or key.endswith(("rotary_emb.inv_freq", "_wd_unit_major")):
            continue
        m = _MLP_KEY.match(key)
        if m is None:
            out[key] = t
            continue
        layer, suffix = int(m.group(1)), m.group(2)
        if suffix not in _MLP_SUFFIXES:
            unexpected.append(orig_key)
            continue
        part, layout, transposed = _MLP_SUFFIXES[suffix]
        if part == "gate_up":
            if t.dim() != 2 or tuple(t.shape) != (2 * f, d):
                raise ValueError(f"{orig_key} has shape {tuple(t.shape)}; a fused gate_up weight must be {(2 * f, d)}")
            pieces = {"gate": t[:f], "up": t[f:]}
        else:
            target = (d, f) if part == "down" else (f, d)
            w = _orient(t, target, transposed, orig_key)
            if layout == "hf" and part == "down" and w is not t and d != f:
                layout = "hf-down-t"
            pieces = {part: w}
        layouts.add(layout)
        for p, w in pieces.items():
            if (layer, p) in parts:
                raise ValueError(
                    f"layer {layer} has two {p} weights: {parts[(layer, p)][0]} and {orig_key}; remove one of them"
                )
            parts[(layer, p)] = (orig_key, w.contiguous())

    name = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
    for (layer, p), (_, w) in parts.items():
        out[f"model.layers.{layer}.mlp.{name[p]}.weight"] = w

    if config.tie_word_embeddings:
        out.pop("lm_head.weight", None)  # the model ties it to model.embed_tokens.weight

    expected = _expected_shapes(config)
    unexpected += [k for k in out if k not in expected]
    missing = [k for k in expected if k not in out]
    if unexpected or missing:
        raise ValueError(
            "the checkpoint does not match a SparseLM/Llama model with this config "
            f"(hidden={d}, intermediate={f}, layers={config.num_hidden_layers}); detected layout(s): "
            f"{', '.join(sorted(layouts)) or 'none'}. Unexpected keys: {_fmt_keys(unexpected)}. "
            f"Missing keys: {_fmt_keys(missing)}. Supported MLP key layouts: {', '.join(sorted(_MLP_SUFFIXES))} "
            "(see twell.models.sparselm)"
        )
    bad = [f"{k}: {tuple(out[k].shape)} != {s}" for k, s in expected.items() if tuple(out[k].shape) != s]
    if bad:
        raise ValueError(f"checkpoint shapes do not match the config: {'; '.join(bad[:10])}")
    return out, sorted(layouts)


def _fmt_keys(keys: list[str]) -> str:
    if not keys:
        return "none"
    return str(keys[:10]) + (f" (+{len(keys) - 10} more)" if len(keys) > 10 else "")


def _expected_shapes(config: TwellLlamaConfig) -> dict[str, tuple[int, ...]]:
    """The persistent state-dict keys and shapes of the model ``config`` describes (built on meta: no memory)."""
    with torch.device("meta"):
        model = TwellLlamaForCausalLM(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


# ---------------------------------------------------------------------------------------------- entry point
def load_sparselm(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    force_relu: bool = False,
    **config_overrides: Any,
) -> TwellLlamaForCausalLM:
    """Load a published SparseLM checkpoint from the local directory ``path`` as a :class:`TwellLlamaForCausalLM`.

    Args:
        path: directory with ``config.json`` and the weights (safetensors, possibly sharded, or .bin).
        dtype: parameter dtype; None keeps the checkpoint's floating dtype.
        device: where to put the model (default: CPU).
        force_relu: accept a plain Llama config whose ``hidden_act`` is not ReLU (see the module docs).
        **config_overrides: :class:`TwellLlamaConfig` arguments, e.g. ``twell_backend="torch"``,
            ``l1_coef=0.0``, ``attn_implementation="sdpa"``.

    The model is returned in eval mode, its layout noted in ``model.config.twell_source_layout``.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(
            f"{str(path)!r} is not a local directory; load_sparselm reads a downloaded checkpoint and never fetches "
            "one (e.g. `huggingface-cli download SakanaAI/SparseLM1.5B --local-dir DIR` first)"
        )
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{root} has no config.json")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
    config = sparselm_config_from_dict(json.loads(cfg_file.read_text()), force_relu=force_relu, **config_overrides)
    state, layouts = convert_sparselm_state_dict(load_state_dict_files(root), config)
    if dtype is None:
        floats = [t.dtype for t in state.values() if t.is_floating_point()]
        dtype = max(set(floats), key=floats.count) if floats else torch.float32
    config.twell_source_layout = ",".join(layouts)
    # from_pretrained with an in-memory state dict: transformers builds the skeleton without initialising
    # it, loads the tensors, ties the embeddings and fills the non-persistent buffers (rotary inv_freq).
    model = TwellLlamaForCausalLM.from_pretrained(None, config=config, state_dict=state, dtype=dtype)
    if device is not None:
        model = model.to(device)
    logger.info("loaded SparseLM from %s (layout %s)", root, config.twell_source_layout)
    return model.eval()
