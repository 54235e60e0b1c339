"""The twell models' causal mask for SDPA in a traced forward: left to SDPA's ``is_causal`` where the call proves it.

transformers builds a boolean ``[B, 1, q, kv]`` mask for SDPA unless it can tell that the plain causal mask is meant;
then it passes none and SDPA runs with ``is_causal=True`` (``masking_utils.sdpa_mask``'s skip).  Eagerly it can.
While torch.compile traces the model it cannot, for two reasons on the GPU machines' transformers (5.17, torch 2.11):
its skip test declines whenever it is tracing, and a backbone called without a cache (``use_cache=False``, as the
benchmarks and most prefill-only code do) hands ``create_causal_mask`` the position ids that the backbone itself
built, which it then checks for packed sequences, a check that under tracing always yields a packed-sequence mask.
So a compiled or CUDA-graph-recorded forward gives SDPA a materialised mask: cuDNN's attention then computes the
masked half too and reads the mask.  Seen first in session 51's recorded 1.5B forward at 2048 tokens (H100 80GB HBM3,
bench_results/h100/probe_heavy64_count_2048_callheavyrows4_session51.log): cuDNN's attention 3.77 ms over 28 layers
recorded against 1.56 ms eager, in the dense and the sparse model alike.  Measured with both rules (session 54, same
card, bench_results/h100/session54_runs.md, each variant in its own process): the recorded sparse forward 13.33 ->
11.06 ms at 2048 tokens (dense 13.40 -> 11.18) and 42.83 -> 32.79 ms at 8192 (dense 51.23 -> 40.91: 1.196x -> 1.248x
of recorded dense), the attention as in the eager forward; rule 1 alone changed nothing (13.32 ms): the
packed-sequence check had forbidden the skip first.

Two rules, read from Python values and shapes only (never a tensor's contents, so they hold in a traced graph: a new
shape is a new graph under torch.compile's guards):

1. the mask function: a twell config, no padding mask given, the query as long as the keys with no key offset (no
   cached positions before it), no local window, and the caller allowing the skip (transformers forbids it for extra
   mask functions, packed sequences and compiled decoding): no mask;
2. the packed-sequence check: a twell backbone called without position ids and without a padding mask built its own
   positions, ``0 .. q-1`` in every row, so there is no packed sequence (a forward pre-hook on the backbone, which
   :func:`attach` registers, marks such a call; a forward hook that runs even on an exception clears the mark).

Then SDPA's ``is_causal=True`` computes the same attention.  Every other call, and every model that is neither a
twell model nor converted by :func:`twell.models.apply`, goes to transformers' own functions unchanged.

A model converted in place keeps its transformers config, so rule 1 cannot key on the config's class there:
:func:`enable` (called by :func:`twell.models.apply`) registers hooks on its transformers ``LlamaModel`` /
``Qwen2Model`` backbones that mark each call as a converted backbone's (both rules then apply within it), and
:func:`disable` (called by :func:`twell.models.revert`) turns them off (the hooks stay, doing nothing).  No
attribute of the config changes, so a saved checkpoint carries no trace of it.  Other architectures are left to
transformers: rule 2 needs a backbone that builds contiguous positions ``past .. past+q-1`` when given none, which
these two families' forwards do.

:func:`install` wraps transformers' ``"sdpa"`` mask function and its packed-sequence check once (``twell.models``
calls it on import; idempotent); :data:`SKIP_TRACED_CAUSAL_MASK` turns both rules off at call time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import masking_utils
from transformers.masking_utils import AttentionMaskInterface

__all__ = ["SKIP_TRACED_CAUSAL_MASK", "attach", "causal_skip_applies", "disable", "enable", "install"]

#: Both rules on (True) or off (False: every call goes to transformers' own functions); read at call time.
SKIP_TRACED_CAUSAL_MASK = True

_MARK = "_twell_causal_skip_wraps"
#: Attribute of a backbone given twell's hooks: which rules its calls get, ``"twell"`` (a twell model's backbone:
#: rule 2; rule 1 follows its config), ``"converted"`` (:func:`enable`: both) or None (:func:`disable`d: neither).
#: The hooks read it at each call, so a deep copy of the model (attribute and hooks copied together) keeps them.
_RULES_ATTR = "_twell_causal_mask_rules"
#: Set by a twell backbone's pre-hook for a call that builds its own positions (rule 2), cleared after the call.
_own_positions = False
#: Set by a converted backbone's pre-hook (:func:`enable`) for the length of its call: rule 1 applies to its config.
_in_converted_backbone = False


def _query_length(kwargs: dict[str, Any]) -> int | None:
    """The query length from the mask function's arguments: ``q_length`` (recent 5.x) or the length of
    ``cache_position`` (earlier 5.x); None when neither is there."""
    q = kwargs.get("q_length")
    if isinstance(q, int):
        return q
    pos = kwargs.get("cache_position")
    if isinstance(pos, torch.Tensor) and pos.dim() == 1:
        return int(pos.shape[0])
    return None


def causal_skip_applies(config: object, kwargs: dict[str, Any]) -> bool:
    """True iff a call of the ``"sdpa"`` mask function with these keyword arguments asks for the plain causal mask
    of a twell model, as judged from shapes and Python values alone (see the module docs)."""
    from .llama import TwellLlamaConfig
    from .qwen2 import TwellQwen2Config

    if not SKIP_TRACED_CAUSAL_MASK:
        return False
    if not (_in_converted_backbone or isinstance(config, (TwellLlamaConfig, TwellQwen2Config))):
        return False
    if not kwargs.get("allow_is_causal_skip", False) or kwargs.get("attention_mask") is not None:
        return False
    if kwargs.get("local_size") is not None or kwargs.get("kv_offset", 0) != 0:
        return False
    q_length, kv_length = _query_length(kwargs), kwargs.get("kv_length")
    return isinstance(kv_length, int) and q_length == kv_length


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    def twell_sdpa_mask(*args: Any, **kwargs: Any) -> Any:
        if not args and causal_skip_applies(kwargs.get("config"), kwargs):
            return None
        return original(*args, **kwargs)

    setattr(twell_sdpa_mask, _MARK, original)
    twell_sdpa_mask.__doc__ = f"twell's causal-mask skip (twell.models.causal_mask) around {original!r}."
    return twell_sdpa_mask


def _wrap_packed(original: Callable[..., Any]) -> Callable[..., Any]:
    def twell_find_packed_sequence_indices(position_ids: torch.Tensor) -> Any:
        if _own_positions and SKIP_TRACED_CAUSAL_MASK:
            return None  # rule 2: positions 0 .. q-1 in every row, one sequence per row
        return original(position_ids)

    setattr(twell_find_packed_sequence_indices, _MARK, original)
    return twell_find_packed_sequence_indices


def install() -> None:
    """Wrap transformers' ``"sdpa"`` mask function (rule 1) and its packed-sequence check (rule 2), once."""
    current = AttentionMaskInterface._global_mapping.get("sdpa")
    if current is not None and not hasattr(current, _MARK):
        AttentionMaskInterface.register("sdpa", _wrap(current))
    packed = getattr(masking_utils, "find_packed_sequence_indices", None)
    if packed is not None and not hasattr(packed, _MARK):
        masking_utils.find_packed_sequence_indices = _wrap_packed(packed)


def _mark_call(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    """Forward pre-hook of a backbone given twell's hooks: mark a call given only ``input_ids`` (or
    ``inputs_embeds``) and options, without position ids or a padding mask, for rule 2 (positional arguments past
    the first: not marked), and a converted backbone's call for rule 1."""
    global _own_positions, _in_converted_backbone
    rules = getattr(module, _RULES_ATTR, None)
    if rules is None:
        return
    _own_positions = (len(args) <= 1 and kwargs.get("position_ids") is None
                      and kwargs.get("attention_mask") is None)
    _in_converted_backbone = rules == "converted"


def _clear_marks(module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
    global _own_positions, _in_converted_backbone
    _own_positions = False
    _in_converted_backbone = False


def _set_rules(backbone: nn.Module, rules: str | None) -> None:
    """Give ``backbone`` these rules, registering the two hooks the first time (a forward hook that runs even when
    the forward raises clears the marks)."""
    if not hasattr(backbone, _RULES_ATTR):
        backbone.register_forward_pre_hook(_mark_call, with_kwargs=True)
        backbone.register_forward_hook(_clear_marks, with_kwargs=True, always_call=True)
    object.__setattr__(backbone, _RULES_ATTR, rules)  # a plain attribute: not in the state dict or the config


def attach(backbone: nn.Module) -> None:
    """Register rule 2's hooks on a twell model's decoder backbone (``LlamaModel`` / ``Qwen2Model``), once."""
    if getattr(backbone, _RULES_ATTR, None) != "twell":
        _set_rules(backbone, "twell")


def _converted_backbones(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from transformers import LlamaModel, Qwen2Model

    from ..nn import SparseGatedMLP

    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, (LlamaModel, Qwen2Model))
            and any(isinstance(sub, SparseGatedMLP) for sub in m.modules())]


def enable(model: nn.Module) -> list[str]:
    """Give a model converted by :func:`twell.models.apply` both rules: each transformers ``LlamaModel`` /
    ``Qwen2Model`` in it that holds a :class:`~twell.nn.SparseGatedMLP` marks its calls.  Returns the qualified
    names of the backbones enabled (``""`` for ``model`` itself); a twell model's backbone keeps its own rules and
    is not listed."""
    enabled = []
    for name, backbone in _converted_backbones(model):
        if getattr(backbone, _RULES_ATTR, None) not in ("twell", "converted"):
            _set_rules(backbone, "converted")
            enabled.append(name)
    return enabled


def disable(model: nn.Module) -> list[str]:
    """Turn off the rules :func:`enable` gave ``model``'s backbones (a twell model's own stay).  Returns the qualified
    names of the backbones turned off."""
    disabled = []
    for name, backbone in model.named_modules():
        if getattr(backbone, _RULES_ATTR, None) == "converted":
            _set_rules(backbone, None)
            disabled.append(name)
    return disabled
