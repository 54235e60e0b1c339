"""Greedy decoding with a static KV cache and, on CUDA, the one-token step replayed from a CUDA graph.

Why a loop of our own: through transformers' ``generate`` (static cache, compiled decode step) a
1.5B-shaped model decoded one sequence at 206-241 tokens/s on an H200, ~4-5 ms per token, for about
1.5 ms of GPU work per step (the weights are 3 GB), dense or sparse alike
(bench_results/h200/model/model_1.5b_decode_session5.json): the host sets the pace, so what the sparse
FFN saves on the GPU cannot show.  Here the whole step -- embedding, every layer, the last position's
logits, the argmax, the end-of-sequence bookkeeping and the position increment -- is recorded once in
a CUDA graph and replayed per token: one launch per token from the host.

What it computes is ``model.generate(input_ids, max_new_tokens=n, do_sample=False)``: the same tokens
(``tests/test_generation.py`` compares them on the CPU, where the same step runs eagerly, and on the
GPU), for full prompts and for left-padded batches given with their ``attention_mask``.  With
``eos_token_id``, a sequence that has produced it continues with ``pad_token_id``, and the output ends
after the step at which every sequence had finished, as ``generate`` stops there; without it, exactly
``max_new_tokens`` tokens are generated.  All ``max_new_tokens`` steps run either way: noticing that
every sequence has finished would take a device-to-host read per token.

The recorded step runs the sparse layers under :func:`twell.nn.static_dispatch`: each layer's kernels
are the ones its policy picks for the batch size at its current l0 estimate (refreshed by the eager
prompt forward), fixed for the whole generation; a graphed decoder also lets the small-batch kernels run
(``small_batch_kernels``): at one token always, at 2-64 tokens where the policy's decode table for the layer's
shape allows the layer's density; they win under CUDA graphs.  A :class:`GreedyDecoder`
keeps its recorded graphs (each with its own static KV cache) for the next call of the same batch size
and length, keyed also on the model's parameter storage and the sparse layers' decisions, so swapping
modules, moving weights or changing a dispatch policy records a new graph instead of replaying a stale one.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .nn import DispatchPolicy, SparseGatedMLP, static_dispatch

__all__ = ["GreedyDecoder", "greedy_decode", "record_cuda_graph"]

#: Recorded graphs a decoder keeps (least recently used dropped first).  Each holds a static KV cache:
#: 3.7 GB at batch 64 x 256 positions for the 1.5B shape, so a handful at most.
DEFAULT_MAX_GRAPHS = 2
#: Eager runs of the step on a side stream before recording (allocator and autotuning warm-up).
_WARMUP_STEPS = 2


def record_cuda_graph(fn: Callable[[], object], *, device: torch.device | None = None,
                      warmup_calls: int = _WARMUP_STEPS) -> Callable[[], None]:
    """``fn``'s kernels recorded once in a CUDA graph on ``device`` (default: the current one), after
    ``warmup_calls`` runs on a side stream (compilation, autotuning, allocations); returns the graph's replay, which
    re-runs them with no host work per kernel.  ``fn`` must be capturable (no host synchronisation): how
    :class:`GreedyDecoder` records its step, and ``twell tune-decode`` a layer's calls."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup_calls):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _check_ids(input_ids: object, device: torch.device) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor [batch, prompt_len], got {type(input_ids).__name__}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must be int64 or int32 token ids, got {str(input_ids.dtype).replace('torch.', '')}")
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape [batch >= 1, prompt_len >= 1], got {tuple(input_ids.shape)}")
    if input_ids.device != device:
        raise ValueError(f"input_ids are on {input_ids.device} but the model is on {device}; move one of them")
    return input_ids


def _check_mask(mask: object, ids: torch.Tensor) -> torch.Tensor | None:
    """None for no padding (None or all ones); else the int64 mask of a left-padded batch (one sync)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape or mask.device != ids.device:
        raise ValueError(
            f"attention_mask must be a tensor of input_ids' shape {tuple(ids.shape)} on {ids.device}, got "
            + (f"{tuple(mask.shape)} on {mask.device}" if isinstance(mask, torch.Tensor) else type(mask).__name__))
    m = mask.to(torch.int64)
    if bool(((m != 0) & (m != 1)).any()):
        raise ValueError("attention_mask must hold 0 (padding) and 1 (token) only")
    if bool((m.sum(-1) == 0).any()):
        raise ValueError("attention_mask has a row without any token")
    if bool((m[:, 1:] < m[:, :-1]).any()):
        raise ValueError("attention_mask must be left-padded (each row's zeros before its ones), as generate "
                         "expects for decoder-only models")
    return None if bool(m.all()) else m


def _check_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def _eos_ids(eos_token_id: int | Sequence[int] | None) -> tuple[int, ...]:
    if eos_token_id is None:
        return ()
    ids = (eos_token_id,) if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool) else eos_token_id
    try:
        out = tuple(ids)  # type: ignore[arg-type]
    except TypeError:
        out = ()
    if not out or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in out):
        raise ValueError(
            f"eos_token_id must be None, a token id >= 0 or a non-empty sequence of them, got {eos_token_id!r}")
    return out


def _unit_major_down_ptr(mlp: SparseGatedMLP, batch: int) -> int:
    """For a sparse layer whose ``batch``-token calls take the small-batch kernels: its unit-major Wd^T
    copy, refreshed now (a decode step reads it unchecked, ``static_dispatch(unit_major_down=True)``), and
    that copy's storage address (rebuilt at a new address after a weight change: a new recording); 0 for
    the other layers and where nothing is cached (inference-tensor weights: the step reads the view)."""
    if mlp._path(batch, mlp._weights()[0].device.type) != "decode":
        return 0
    mlp.w_down_unit_major()
    cached = mlp._buffers["_wd_unit_major"]
    return 0 if cached is None else cached.data_ptr()


def _static_cache(model: nn.Module, max_len: int, batch: int) -> Any:
    from transformers import StaticCache

    params = inspect.signature(StaticCache.__init__).parameters
    kwargs: dict[str, Any] = {"config": model.config, "max_cache_len": max_len}
    if "max_batch_size" in params:  # transformers releases that allocate the cache up front
        kwargs.update(max_batch_size=batch, device=model.device, dtype=model.dtype)
    return StaticCache(**kwargs)


@dataclass
class _Recorded:
    """One recorded decode step: its cache, the buffers it reads and writes, and how to run it."""

    cache: Any
    tok: torch.Tensor  # [B, 1] the last token of each sequence (input of the step, then its output)
    pos: torch.Tensor  # [1] the position the step writes
    done: torch.Tensor  # [B, 1] bool: the sequence has produced an end-of-sequence token
    run: Callable[[], None]
    decisions: tuple[str, ...]  # the sparse layers' kernel choices the step was recorded with
    mask: torch.Tensor | None = None  # [B, P + n] left-padded batches: 0 at the pads, 1 everywhere else
    posid: torch.Tensor | None = None  # [B, 1] left-padded batches: the position id of the step's token


class GreedyDecoder:
    """Greedy decoding of ``model`` (a Hugging Face causal LM taking ``past_key_values`` and
    ``cache_position``, in eval mode); see the module docstring.

    Args:
        model: the causal LM (any, not only twell's: the dense baseline decodes through the same loop).
        eos_token_id: None (always ``max_new_tokens`` tokens), a token id or a sequence of them.
        pad_token_id: what a finished sequence continues with; default the first end-of-sequence id.
        cuda_graph: record the step in a CUDA graph; default True on a CUDA model, and only possible there.
        max_graphs: recorded graphs kept for later calls (each with its own static KV cache).
        compile: False, or a ``torch.compile`` backend name (True = "inductor") for the step before it
            is recorded: on the GPU the recorded step of the 1.5B model was 3.2 ms, of which only ~0.7 ms
            were the FFN's GEMVs and ~2 ms hundreds of small elementwise kernels that compilation fuses
            (bench_results/h200/model/decode_step_profile_fused_session5.log).  The sparse layers take
            their traced path (custom ops) inside the compiled step.
        small_batch_kernels: during each call, give the sparse layers' policies ``decode_graphed=True`` (the
            decode tables apply: a step of 2-64 tokens takes the small-batch kernels where the table of the
            layer's shape allows its density) and ``decode_max_tokens >= 1`` (one-token calls, a batch-1 step,
            take them whatever the density), still subject to their device types and layer shapes; their
            policies are restored afterwards.  Default: on when the step is CUDA-graphed, where they win and
            eagerly they lose (H200, bf16, 2048 x 5632 at 0.5 %
            density: 17.5 against 31.2 us for the dense FFN under CUDA graphs; eagerly, host time included,
            the small-batch path ran 0.60x; the 1.5B model's graphed step 2.751 vs 3.105 ms, and its
            compiled and graphed decode 1.160x at batch 1; bench_results/h200/decode_probe_onepass_session6.log,
            model/decode_step_*_session6.log, model/model_1.5b_decode_compiled_onepass_session6.json).
        one_token_kernels: the name ``small_batch_kernels`` had before session 34 (when it lifted one-token calls
            only); either may be given, not both with different values.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        cuda_graph: bool | None = None,
        max_graphs: int = DEFAULT_MAX_GRAPHS,
        compile: bool | str = False,  # noqa: A002 - the torch.compile option's name
        small_batch_kernels: bool | None = None,
        one_token_kernels: bool | None = None,
    ) -> None:
        if not isinstance(model, nn.Module) or not hasattr(model, "config"):
            raise TypeError(
                f"model must be a Hugging Face causal LM (an nn.Module with a config), got {type(model).__name__}")
        self.model = model
        self.eos = _eos_ids(eos_token_id)
        if pad_token_id is not None and (isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int)
                                         or pad_token_id < 0):
            raise ValueError(f"pad_token_id must be None or a token id >= 0, got {pad_token_id!r}")
        self.pad = pad_token_id if pad_token_id is not None else (self.eos[0] if self.eos else 0)
        device = next(model.parameters()).device
        if cuda_graph is None:
            cuda_graph = device.type == "cuda"
        if cuda_graph and device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs a model on a CUDA device; this one is on {device}")
        self.cuda_graph = bool(cuda_graph)
        if compile is True:
            compile = "inductor"
        if compile is not False and (not isinstance(compile, str) or not compile):
            raise ValueError(f"compile must be False, True or a torch.compile backend name, got {compile!r}")
        self.compile_backend: str | None = compile or None
        self.max_graphs = _check_count(max_graphs, "max_graphs")
        for name, value in (("small_batch_kernels", small_batch_kernels), ("one_token_kernels", one_token_kernels)):
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{name} must be None or a bool, got {type(value).__name__}")
        if None not in (small_batch_kernels, one_token_kernels) and small_batch_kernels != one_token_kernels:
            raise ValueError(f"small_batch_kernels={small_batch_kernels} and one_token_kernels={one_token_kernels} "
                             "disagree; one_token_kernels is the older name of the same option: give one")
        chosen = small_batch_kernels if small_batch_kernels is not None else one_token_kernels
        self.small_batch_kernels = self.cuda_graph if chosen is None else chosen
        # policy -> the same policy with decode_graphed and decode_max_tokens >= 1, one object per policy (stable
        # identity)
        self._graphed_policies: dict[DispatchPolicy, DispatchPolicy] = {}
        self._recorded: collections.OrderedDict[tuple, _Recorded] = collections.OrderedDict()
        params = inspect.signature(model.forward).parameters
        self._logits_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        # transformers 5.2x renamed the forward's past_key_values to cache (the old name warns)
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def clear(self) -> None:
        """Drop the recorded graphs and their KV caches."""
        self._recorded.clear()

    # ------------------------------------------------------------------------------------------ call
    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, max_new_tokens: int,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, P + n]``: the prompts followed by the generated tokens (see the module docstring).

        ``attention_mask`` [B, P] (1 = token, 0 = padding) takes a batch of prompts of different lengths,
        left-padded as ``generate`` wants them (a row's padding before its tokens); all ones, or None,
        is the unpadded path."""
        model = self.model
        if model.training:
            raise RuntimeError("greedy decoding needs the model in eval mode (model.eval())")
        device = next(model.parameters()).device
        ids = _check_ids(input_ids, device)
        n = _check_count(max_new_tokens, "max_new_tokens")
        mask = _check_mask(attention_mask, ids)
        if n == 0:
            return ids.clone()
        layers = self._sparse_layers()
        with self._small_batch_policy(layers):
            return self._generate(ids, n, mask, layers, device)

    # ------------------------------------------------------------------------------------ internals
    @property
    def one_token_kernels(self) -> bool:
        """The older name of :attr:`small_batch_kernels`."""
        return self.small_batch_kernels

    def step_paths(self, batch: int) -> list[str]:
        """Each sparse layer's kernel choice (``"decode"``, ``"sparse"`` or ``"dense"``) for a decode step of ``batch``
        sequences at its current l0 estimate, under the policies this decoder gives them during a call."""
        layers = self._sparse_layers()
        device = next(self.model.parameters()).device
        with self._small_batch_policy(layers):
            return list(self._decisions(_check_count(batch, "batch"), device, layers))

    @contextlib.contextmanager
    def _small_batch_policy(self, layers: list[SparseGatedMLP]) -> Iterator[None]:
        """With ``small_batch_kernels``, each sparse layer's policy is lifted for the duration (decode tables on,
        one-token calls to the small-batch kernels); the layers' own policies are put back afterwards."""
        saved = [(m, m.policy) for m in layers] if self.small_batch_kernels else []
        try:
            for m, policy in saved:
                if policy.decode_max_tokens < 1 or not policy.decode_graphed:
                    if policy not in self._graphed_policies:
                        self._graphed_policies[policy] = dataclasses.replace(
                            policy, decode_max_tokens=max(1, policy.decode_max_tokens), decode_graphed=True)
                    m.policy = self._graphed_policies[policy]
            yield
        finally:
            for m, policy in saved:
                m.policy = policy

    def _generate(self, ids: torch.Tensor, n: int, mask: torch.Tensor | None, layers: list[SparseGatedMLP],
                  device: torch.device) -> torch.Tensor:
        b, p = ids.shape
        padded = mask is not None
        key = self._key(b, p + n, padded, layers)
        rec = self._recording(key, b, p + n, device, padded)
        self._prefill(rec, ids, mask, device)
        if self.cuda_graph and rec.decisions != self._decisions(b, device, layers):
            # The prompt's forward moved a layer's l0 estimate across a threshold of its policy: the
            # recorded step would run the old kernels.  Record it again and redo the prompt.  (Eager and
            # compiled steps decide, or are guarded, on every call.)
            self._recorded.pop(key, None)
            rec = self._recording(key, b, p + n, device, padded)
            self._prefill(rec, ids, mask, device)
        out = torch.empty((b, n), dtype=ids.dtype, device=device)
        out[:, 0] = rec.tok[:, 0]
        for i in range(1, n):
            rec.run()
            out[:, i] = rec.tok[:, 0]
        if self.eos:
            out = out[:, : self._generated_length(out, device)]
        return torch.cat([ids, out], dim=1)

    def _eos_tensor(self, device: torch.device) -> torch.Tensor:
        return torch.tensor(self.eos, dtype=torch.int64, device=device)

    def _generated_length(self, out: torch.Tensor, device: torch.device) -> int:
        """Tokens up to the step at which the last sequence finished (generate stops there); one sync."""
        n = out.shape[1]
        is_eos = torch.isin(out, self._eos_tensor(device))
        steps = torch.arange(1, n + 1, device=device).expand_as(out)
        first_end = torch.where(is_eos, steps, torch.full_like(steps, n)).amin(dim=1)
        return int(first_end.amax())

    def _prefill(self, rec: _Recorded, ids: torch.Tensor, mask: torch.Tensor | None, device: torch.device) -> None:
        """The prompt's forward into the emptied cache (eager: the sparse layers refresh their l0
        estimates as in any call), then the step's buffers set for the first decode step.  Left-padded
        prompts: position ids count each row's tokens only, as generate computes them, and the step's
        mask is the prompt's followed by ones (positions past the step are hidden by causality anyway)."""
        p = ids.shape[1]
        rec.cache.reset()
        extra: dict[str, torch.Tensor] = {}
        if mask is not None:
            assert rec.mask is not None and rec.posid is not None
            rec.mask.fill_(1)
            rec.mask[:, :p] = mask
            extra["attention_mask"] = rec.mask[:, :p]
            extra["position_ids"] = (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 1)
            rec.posid.copy_(mask.sum(-1, keepdim=True))  # the first generated token's position id
        logits = self.model(input_ids=ids, cache_position=torch.arange(p, device=device), use_cache=True,
                            **{self._cache_arg: rec.cache}, **self._logits_kw, **extra).logits
        rec.tok.copy_(logits[:, -1].argmax(-1, keepdim=True))
        rec.pos.fill_(p)
        rec.done.zero_()
        if self.eos:
            rec.done.copy_(torch.isin(rec.tok, self._eos_tensor(device)))

    def _sparse_layers(self) -> list[SparseGatedMLP]:
        """The model's sparse layers, in module order (walked once per call: modules can be swapped)."""
        return [m for m in self.model.modules() if isinstance(m, SparseGatedMLP)]

    def _key(self, batch: int, length: int, padded: bool, layers: list[SparseGatedMLP] | None = None) -> tuple:
        # What a recorded graph bakes in besides the kernel choices: parameter storage, module identity and
        # the sparse layers' unit-major Wd^T copies (rebuilt, at a new address, after a weight change).
        layers = self._sparse_layers() if layers is None else layers
        return (batch, length, padded, tuple(q.data_ptr() for q in self.model.parameters()),
                tuple(id(m) for m in layers), tuple(_unit_major_down_ptr(m, batch) for m in layers))

    def _decisions(self, batch: int, device: torch.device, layers: list[SparseGatedMLP] | None = None
                   ) -> tuple[str, ...]:
        """Each sparse layer's kernel choice for a ``batch``-token call at its current l0 estimate."""
        layers = self._sparse_layers() if layers is None else layers
        return tuple(m._path(batch, device.type) for m in layers)

    def _recording(self, key: tuple, batch: int, length: int, device: torch.device, padded: bool) -> _Recorded:
        """The recording kept under ``key`` (see :meth:`_key`), or a new one."""
        rec = self._recorded.get(key)
        if rec is not None:
            self._recorded.move_to_end(key)
            return rec
        while self._recorded and len(self._recorded) >= max(1, self.max_graphs):
            self._recorded.popitem(last=False)
        rec = self._build(batch, length, device, padded)
        if self.max_graphs:
            self._recorded[key] = rec
        return rec

    def _build(self, batch: int, length: int, device: torch.device, padded: bool = False) -> _Recorded:
        """A static cache, the step's buffers and, with ``cuda_graph``, the step recorded.  Recorded before
        the prompt's forward, whose ``cache.reset()`` then empties whatever the recording's runs wrote
        (transformers' static cache layers keep their write position on the device and reset it there)."""
        cache = _static_cache(self.model, length, batch)
        tok = torch.zeros((batch, 1), dtype=torch.int64, device=device)
        pos = torch.zeros((1,), dtype=torch.int64, device=device)
        done = torch.zeros((batch, 1), dtype=torch.bool, device=device)
        mask = torch.ones((batch, length), dtype=torch.int64, device=device) if padded else None
        posid = torch.zeros((batch, 1), dtype=torch.int64, device=device) if padded else None
        step = self._step_fn(cache, tok, pos, done, mask, posid, device)
        if not self.cuda_graph:
            return _Recorded(cache, tok, pos, done, step, self._decisions(batch, device), mask, posid)
        # One eager call first: it allocates the cache (its first update does) and gives every sparse
        # layer an l0 estimate; then warm-up runs on a side stream and the recording, both with the
        # sparse layers' kernel choices frozen (static_dispatch).
        self.model(input_ids=tok, cache_position=pos, use_cache=True, **{self._cache_arg: cache}, **self._logits_kw)

        def frozen_step() -> None:
            with static_dispatch(unit_major_down=True):
                step()

        replay = record_cuda_graph(frozen_step, device=device)
        return _Recorded(cache, tok, pos, done, replay, self._decisions(batch, device), mask, posid)

    def _step_fn(self, cache: Any, tok: torch.Tensor, pos: torch.Tensor, done: torch.Tensor,
                 mask: torch.Tensor | None, posid: torch.Tensor | None, device: torch.device) -> Callable[[], None]:
        """One decode step over static buffers: reads tok at pos, writes the next token and pos + 1 (and,
        for left-padded batches, reads the static mask and advances each row's position id)."""
        model, pad = self.model, self.pad
        kw: dict[str, Any] = {self._cache_arg: cache, **self._logits_kw}
        if mask is not None:
            kw.update(attention_mask=mask, position_ids=posid)
        eos = self._eos_tensor(device) if self.eos else None

        def step() -> None:
            logits = model(input_ids=tok, cache_position=pos, use_cache=True, **kw).logits
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            if eos is not None:
                nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
                done.logical_or_(torch.isin(nxt, eos))
            tok.copy_(nxt)
            pos.add_(1)
            if posid is not None:
                posid.add_(1)

        if self.compile_backend is None:
            return step
        compiled = torch.compile(step, backend=self.compile_backend, dynamic=False)

        def compiled_step() -> None:
            # the path the sparse layers trace (what any later trace sees too)
            with static_dispatch(unit_major_down=True):
                compiled()

        return compiled_step


def greedy_decode(
    model: nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    cuda_graph: bool | None = None,
    compile: bool | str = False,  # noqa: A002 - the torch.compile option's name
    attention_mask: torch.Tensor | None = None,
    small_batch_kernels: bool | None = None,
    one_token_kernels: bool | None = None,
) -> torch.Tensor:
    """One greedy generation (a :class:`GreedyDecoder` that keeps nothing); ``[B, P + n]`` token ids."""
    decoder = GreedyDecoder(model, eos_token_id=eos_token_id, pad_token_id=pad_token_id, cuda_graph=cuda_graph,
                            max_graphs=0, compile=compile, small_batch_kernels=small_batch_kernels,
                            one_token_kernels=one_token_kernels)
    return decoder(input_ids, max_new_tokens, attention_mask)
