"""The twell models' causal mask for SDPA in a traced forward: left to SDPA's ``is_causal`` where shapes prove it.

transformers builds a boolean ``[B, 1, q, kv]`` mask for SDPA unless it can tell that the plain causal mask is meant;
then it passes none and SDPA runs with ``is_causal=True`` (``masking_utils.sdpa_mask``'s skip).  Eagerly it can.
While torch.compile traces the model, the transformers of the GPU machines (5.17, torch 2.11) never skip (recent 5.x
skip there only with torch >= 2.14, their own comment says), so a compiled or CUDA-graph-recorded forward gives SDPA a
materialised mask: cuDNN's attention then computes the masked half too and reads the mask.  Measured (H100 80GB
HBM3, session 51's recorded 1.5B forward at 2048 tokens, one sequence;
bench_results/h100/probe_heavy64_count_2048_callheavyrows4_session51.log): cuDNN's attention 3.77 ms over 28 layers
recorded against 1.56 ms eager, and 0.48 ms of fused kernels building the mask, in a forward of 13.30 ms (dense:
13.43); the same in the dense and the sparse model.

The rule here reads shapes and Python values only, never a tensor's contents, so it holds in a traced graph (a new
shape is a new graph under torch.compile's guards): no padding mask given (``attention_mask is None``), the query as
long as the keys with no key offset (no cached positions before it), no local window (``local_size``), and the
caller allowing the skip (transformers forbids it for extra mask functions, packed sequences and compiled decoding).
Then the mask is ``None`` and SDPA's ``is_causal=True`` is the same attention.  Every other call, and every model
whose config is not a twell config, goes to transformers' own function unchanged.

:func:`install` wraps the registry's ``"sdpa"`` mask function once (``twell.models`` calls it on import; idempotent);
:data:`SKIP_TRACED_CAUSAL_MASK` turns the rule off at call time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.masking_utils import AttentionMaskInterface

__all__ = ["SKIP_TRACED_CAUSAL_MASK", "causal_skip_applies", "install"]

#: The rule on (True) or off (False: every call goes to transformers' own mask function); read at call time.
SKIP_TRACED_CAUSAL_MASK = True

_MARK = "_twell_causal_skip_wraps"


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

    if not SKIP_TRACED_CAUSAL_MASK or not isinstance(config, (TwellLlamaConfig, TwellQwen2Config)):
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


def install() -> None:
    """Wrap transformers' ``"sdpa"`` mask function with the twell models' rule, once."""
    current = AttentionMaskInterface._global_mapping.get("sdpa")
    if current is None or hasattr(current, _MARK):
        return
    AttentionMaskInterface.register("sdpa", _wrap(current))
