"""Model builder for ``twell train`` / ``twell demo``, and a minimal built-in Llama-style fallback.

:func:`build_model` prefers the Hugging Face classes of :mod:`twell.models` (``TwellLlamaForCausalLM``,
whose decoder layers' MLPs are :class:`~twell.nn.SparseGatedMLP`), imported lazily.  When that package is
not importable (it is optional: it needs ``transformers``), or with ``arch="builtin"``, it builds
:class:`TinyLlama` below: the same architecture family as the published models (pre-norm RMSNorm,
causal multi-head attention with rotary embeddings via ``scaled_dot_product_attention``, ReLU-gated
:class:`SparseGatedMLP` FFN, tied input/output embeddings, no biases), written in ~100 lines so the
training recipe can run with nothing but PyTorch.

Both kinds return an object with ``.loss`` / ``.logits`` from ``model(input_ids, labels=labels)``;
the trainer computes the L1 term itself from the sparse layers (model-agnostic), so it uses the LM
loss only (``lm_loss`` below).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..nn.eager_graphs import graph_eager_calls
from ..nn.mlp import SparseGatedMLP

__all__ = ["PRESETS", "ModelSpec", "TinyLlama", "build_model", "count_parameters", "flops_per_token", "lm_loss"]


@dataclass(frozen=True)
class ModelSpec:
    """Architecture sizes.  ``intermediate_size`` follows the published 5632/2048 = 2.75 ratio."""

    hidden_size: int
    n_layers: int
    n_heads: int
    intermediate_size: int
    vocab_size: int = 49152
    max_seq_len: int = 2048
    rope_theta: float = 10000.0


#: Size presets.  "0.5b" and "1.5b" are the published shapes (hidden 2048, FFN 5632, 32 heads of 64,
#: vocab 49,152, 8 / 28 layers); "125m" and "25m" scale them down keeping the FFN ratio 2.75 and head dim
#: 64 (125m: 12 x 768, ~85 M non-embedding + 38 M embedding parameters; 25m: 6 x 384, ~8 M + 19 M at
#: vocab 49,152, or ~10 M total at the local tokenizer's 4096-token vocabulary); "tiny" is the CPU demo
#: model (4 x 128, FFN 352, ~1.2 M parameters at vocab 4096: ~2.4 steps/s of 16 x 128 tokens on 2 cores).
PRESETS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(128, 4, 4, 352, vocab_size=4096, max_seq_len=512),
    "25m": ModelSpec(384, 6, 6, 1056),
    "125m": ModelSpec(768, 12, 12, 2112),
    "0.5b": ModelSpec(2048, 8, 32, 5632),
    "1.5b": ModelSpec(2048, 28, 32, 5632),
}


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, Llama's rotate-half convention; x [B, H, T, Dh], cos/sin [T, Dh].

    The result keeps x's dtype: under bf16 autocast q/k are bf16 but cos/sin follow the fp32 residual
    stream, and fp32 q/k next to a bf16 v would keep attention off the fused bf16 SDPA kernels.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.n_heads = spec.n_heads
        self.head_dim = spec.hidden_size // spec.n_heads
        d = spec.hidden_size
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape

        def heads(p: nn.Linear) -> torch.Tensor:
            return p(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

        q, k, v = _rope(heads(self.q_proj), cos, sin), _rope(heads(self.k_proj), cos, sin), heads(self.v_proj)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, d))


class _Block(nn.Module):
    def __init__(self, spec: ModelSpec, mlp_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.input_layernorm = _RMSNorm(spec.hidden_size)
        self.self_attn = _Attention(spec)
        self.post_attention_layernorm = _RMSNorm(spec.hidden_size)
        self.mlp = SparseGatedMLP(spec.hidden_size, spec.intermediate_size, **mlp_kwargs)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class _Output:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class TinyLlama(nn.Module):
    """Minimal Llama-style causal LM with :class:`SparseGatedMLP` FFNs and tied embeddings (see module docs).

    Init: normal(0, 0.02) for every linear and the embedding (the published/HF Llama initializer range),
    RMSNorm weights 1.
    """

    def __init__(self, spec: ModelSpec, **mlp_kwargs: Any) -> None:
        super().__init__()
        if spec.hidden_size % spec.n_heads or (spec.hidden_size // spec.n_heads) % 2:
            raise ValueError(f"hidden_size {spec.hidden_size} must split into {spec.n_heads} heads of even size")
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        # No recorded eager calls unless asked for (twell.nn.graph_eager_calls turns them on for a trained model that
        # serves): the weights change between two evaluations, so each evaluation would record its counts again (an
        # eager split and a capture per count and layer), and the recordings' static buffers and graph pool would stay
        # allocated through the training steps, for calls whose host time matters little.
        mlp_kwargs.setdefault("eager_graphs", 0)
        self.layers = nn.ModuleList(_Block(spec, mlp_kwargs) for _ in range(spec.n_layers))
        self.norm = _RMSNorm(spec.hidden_size)
        hd = spec.hidden_size // spec.n_heads
        inv = 1.0 / (spec.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(spec.max_seq_len, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("rope_cos", ang.cos().float(), persistent=False)
        self.register_buffer("rope_sin", ang.sin().float(), persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> _Output:
        t = input_ids.shape[1]
        if t > self.spec.max_seq_len:
            raise ValueError(f"sequence length {t} exceeds max_seq_len {self.spec.max_seq_len}")
        x = self.embed_tokens(input_ids)
        cos, sin = self.rope_cos[:t].to(x.dtype), self.rope_sin[:t].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = F.linear(self.norm(x), self.embed_tokens.weight)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
        return _Output(logits, loss)


def lm_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of a ``[B, T + 1]`` block batch (inputs ``ids[:, :-1]``, targets ``ids[:, 1:]``).

    Computed here from the logits (not from the model's ``.loss``) so that it is the pure LM loss for
    any model, including ones whose ``.loss`` already adds an L1 term.
    """
    logits = model(ids[:, :-1]).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _hf_classes() -> tuple[Any, Any] | None:
    try:
        from ..models import TwellLlamaConfig, TwellLlamaForCausalLM  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - optional package: absent, half-built or missing transformers
        return None
    return TwellLlamaConfig, TwellLlamaForCausalLM


def build_model(spec: ModelSpec, *, arch: str = "auto", tile: int | None = None, seed: int = 0) -> nn.Module:
    """The model for ``spec``: ``arch="hf"`` (:mod:`twell.models`), ``"builtin"`` (:class:`TinyLlama`) or
    ``"auto"`` (hf when importable, else builtin).  Parameters are initialised from ``seed``."""
    if arch not in ("auto", "hf", "builtin"):
        raise ValueError(f"arch must be 'auto', 'hf' or 'builtin'; got {arch!r}")
    torch.manual_seed(seed)
    hf = _hf_classes() if arch in ("auto", "hf") else None
    if arch == "hf" and hf is None:
        raise ImportError("twell.models (TwellLlamaForCausalLM) is not importable; use arch='builtin'")
    if hf is not None:
        cfg_cls, model_cls = hf
        kw: dict[str, Any] = {
            "vocab_size": spec.vocab_size,
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.n_layers,
            "num_attention_heads": spec.n_heads,
            "num_key_value_heads": spec.n_heads,
            "max_position_embeddings": spec.max_seq_len,
            "rope_theta": spec.rope_theta,
            "tie_word_embeddings": True,
            "l1_coef": 0.0,  # the trainer adds the L1 term itself
        }
        if tile is not None:
            kw["twell_tile"] = tile
        model = model_cls(cfg_cls(**kw))
        graph_eager_calls(model, 0)  # as TinyLlama's: no recorded eager calls in a model being trained
        return model
    return TinyLlama(spec, **({"tile": tile} if tile is not None else {}))


def count_parameters(model: nn.Module) -> int:
    """Unique parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Approximate training FLOPs per token, 6 N + 12 L T d (Kaplan/Chinchilla accounting)."""
    n = spec.n_layers * (4 * spec.hidden_size**2 + 3 * spec.hidden_size * spec.intermediate_size)
    return 6.0 * n + 12.0 * spec.n_layers * seq_len * spec.hidden_size
