"""Sparse Llama for Hugging Face transformers: ``TwellLlamaConfig``, ``TwellLlamaModel``, ``TwellLlamaForCausalLM``.

The classes subclass transformers' Llama classes and change one thing: every decoder layer's MLP is a
:class:`~twell.nn.SparseGatedMLP` (ReLU gate; TwELL kernels when they pay off, dense otherwise).  The
parameter names are the Llama ones, so a checkpoint saved by these classes is an ordinary Llama state
dict (``model.layers.{i}.mlp.gate_proj.weight`` ...) in ordinary safetensors, readable by
``LlamaForCausalLM`` with ``hidden_act="relu"``; only ``config.json`` differs (``model_type`` and the
twell options).

Training: in training mode with grad enabled each sparse MLP records its L1 penalty, and the causal LM
adds ``config.l1_coef * mean over layers`` of it to the LM loss (the published recipe: coefficient 2e-5,
per-layer penalty = mean over tokens of ``sum_j |h_j|``, averaged over layers).
"""

from __future__ import annotations

from typing import Any

from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

from ..format.twell import DEFAULT_TILE
from . import causal_mask
from ._common import set_twell_options, sparsify_layers, wrap_causal_lm_forward

__all__ = ["TwellLlamaConfig", "TwellLlamaForCausalLM", "TwellLlamaModel"]


class TwellLlamaConfig(LlamaConfig):
    """A :class:`~transformers.LlamaConfig` for the sparse ReLU-gated Llama, with the twell options.

    Args:
        twell_backend: ``"auto"``, ``"torch"`` or ``"triton"``, the sparse inference backend of every MLP.
        twell_tile, twell_capacity: the TwELL layout (``capacity`` None: the format's default).
        twell_precision: ``"match"`` or ``"fp32"`` rounding of the sparse path.
        l1_coef: coefficient of the L1 auxiliary loss added in training (0 disables it).
        hidden_act: must be ``"relu"`` (the default); anything else is refused rather than ignored.
        **kwargs: every :class:`~transformers.LlamaConfig` argument.

    The options are plain attributes set before the parent's ``__init__`` (not dataclass fields): that
    is the form of custom config that both the dataclass configs of recent transformers 5.x and the
    older ``__init__``-style ones accept, and ``to_dict``/``save_pretrained`` write them to config.json.
    """

    model_type = "twell_llama"

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


class TwellLlamaModel(LlamaModel):
    """:class:`~transformers.LlamaModel` whose decoder MLPs are :class:`~twell.nn.SparseGatedMLP`."""

    config_class = TwellLlamaConfig

    def __init__(self, config: TwellLlamaConfig) -> None:
        _check_config(config, TwellLlamaConfig)
        super().__init__(config)
        sparsify_layers(self.layers, config)
        causal_mask.attach(self)
        self.post_init()  # initialises the new MLPs only (the others carry transformers' "initialised" flag)


class TwellLlamaForCausalLM(LlamaForCausalLM):
    """:class:`~transformers.LlamaForCausalLM` with sparse MLPs and the L1 auxiliary loss.

    ``self.model`` is the parent's ``LlamaModel`` with its MLPs replaced in place (building a
    :class:`TwellLlamaModel` instead would construct the decoder twice); the state dict and the
    behaviour are the same.  ``forward`` returns a :class:`~twell.models.TwellCausalLMOutput`.
    """

    config_class = TwellLlamaConfig

    def __init__(self, config: TwellLlamaConfig) -> None:
        _check_config(config, TwellLlamaConfig)
        super().__init__(config)
        sparsify_layers(self.model.layers, config)
        causal_mask.attach(self.model)
        self.post_init()

    forward = wrap_causal_lm_forward(LlamaForCausalLM.forward)


def _check_config(config: object, cls: type) -> None:
    """The twell models need their own config (the twell options, and a ReLU gate checked at config time)."""
    if not isinstance(config, cls):
        raise TypeError(
            f"expected a {cls.__name__}, got {type(config).__name__}; build one with "
            f"{cls.__name__}(**other_config.to_dict()) or convert an existing model with twell.models.apply"
        )
