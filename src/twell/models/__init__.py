"""Hugging Face transformers integration: sparse Llama/Qwen2 models, in-place conversion, SparseLM loading.

Importing this package registers the twell configs and models with the transformers Auto classes
(``AutoConfig``, ``AutoModel``, ``AutoModelForCausalLM``), so a checkpoint saved by a twell model loads
with ``AutoModelForCausalLM.from_pretrained(dir)`` once ``twell.models`` has been imported.

Importing it also gives the twell models' compiled and recorded forwards SDPA's ``is_causal`` instead of a
materialised causal mask where shapes prove the mask causal (:mod:`twell.models.causal_mask`).

Needs the ``hf`` extra (``pip install twell[hf]``: transformers, safetensors).
"""

from __future__ import annotations

try:
    import transformers  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "twell.models needs Hugging Face transformers (and safetensors): pip install 'twell[hf]'"
    ) from err

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from . import causal_mask
from ._common import TwellCausalLMOutput, iter_sparse_mlps, set_dispatch_policy, set_train_dispatch_policy
from .convert import ConversionReport, ConvertedModule, apply, revert
from .llama import TwellLlamaConfig, TwellLlamaForCausalLM, TwellLlamaModel
from .qwen2 import TwellQwen2Config, TwellQwen2ForCausalLM, TwellQwen2Model
from .sparselm import (
    SPARSELM_LAYERS,
    convert_sparselm_state_dict,
    load_sparselm,
    sparselm_config,
    sparselm_config_from_dict,
)

__all__ = [
    "SPARSELM_LAYERS",
    "ConversionReport",
    "ConvertedModule",
    "TwellCausalLMOutput",
    "TwellLlamaConfig",
    "TwellLlamaForCausalLM",
    "TwellLlamaModel",
    "TwellQwen2Config",
    "TwellQwen2ForCausalLM",
    "TwellQwen2Model",
    "apply",
    "convert_sparselm_state_dict",
    "iter_sparse_mlps",
    "load_sparselm",
    "register",
    "revert",
    "set_dispatch_policy",
    "set_train_dispatch_policy",
    "sparselm_config",
    "sparselm_config_from_dict",
]


def register() -> None:
    """Register the twell configs and models with the transformers Auto classes (idempotent)."""
    for config_cls, model_cls, lm_cls in (
        (TwellLlamaConfig, TwellLlamaModel, TwellLlamaForCausalLM),
        (TwellQwen2Config, TwellQwen2Model, TwellQwen2ForCausalLM),
    ):
        AutoConfig.register(config_cls.model_type, config_cls, exist_ok=True)
        AutoModel.register(config_cls, model_cls, exist_ok=True)
        AutoModelForCausalLM.register(config_cls, lm_cls, exist_ok=True)


register()
causal_mask.install()
