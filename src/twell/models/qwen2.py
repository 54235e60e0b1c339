"""Sparse Qwen2 for Hugging Face transformers: ``TwellQwen2Config``, ``TwellQwen2Model``, ``TwellQwen2ForCausalLM``.

The same construction as :mod:`twell.models.llama`: Qwen2's attention (with its q/k/v biases), norms,
rotary embedding and sliding-window options are untouched; only each decoder layer's MLP becomes a
:class:`~twell.nn.SparseGatedMLP`, with Qwen2's MLP parameter names (``gate_proj``/``up_proj``/
``down_proj``, no biases), so checkpoints are ordinary Qwen2 state dicts.
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model

from ..format.twell import DEFAULT_TILE
from . import causal_mask
from ._common import set_twell_options, sparsify_layers, wrap_causal_lm_forward
from .llama import _check_config

__all__ = ["TwellQwen2Config", "TwellQwen2ForCausalLM", "TwellQwen2Model"]


class TwellQwen2Config(Qwen2Config):
    """A :class:`~transformers.Qwen2Config` for the sparse ReLU-gated Qwen2 (options as :class:`TwellLlamaConfig`)."""

    model_type = "twell_qwen2"

    def __init__(
        self,
        twell_backend: str = "auto",
        twell_tile: int = DEFAULT_TILE,
        twell_capacity: int | None = None,
        twell_precision: str = "match",
        l1_coef: float = 2e-5,
        hidden_act: str = "relu",
        **kwargs: Any,
    ) -> None:
        options = {
            "twell_backend": twell_backend,
            "twell_tile": twell_tile,
            "twell_capacity": twell_capacity,
            "twell_precision": twell_precision,
            "l1_coef": l1_coef,
        }
        set_twell_options(self, hidden_act, options, kwargs)
        super().__init__(hidden_act=hidden_act, **kwargs)


class TwellQwen2Model(Qwen2Model):
    """:class:`~transformers.Qwen2Model` whose decoder MLPs are :class:`~twell.nn.SparseGatedMLP`."""

    config_class = TwellQwen2Config

    def __init__(self, config: TwellQwen2Config) -> None:
        _check_config(config, TwellQwen2Config)
        super().__init__(config)
        sparsify_layers(self.layers, config)
        causal_mask.attach(self)
        self.post_init()


class TwellQwen2ForCausalLM(Qwen2ForCausalLM):
    """:class:`~transformers.Qwen2ForCausalLM` with sparse MLPs and the L1 auxiliary loss (see the Llama class)."""

    config_class = TwellQwen2Config

    def __init__(self, config: TwellQwen2Config) -> None:
        _check_config(config, TwellQwen2Config)
        super().__init__(config)
        sparsify_layers(self.model.layers, config)
        causal_mask.attach(self.model)
        self.post_init()

    forward = wrap_causal_lm_forward(Qwen2ForCausalLM.forward)
