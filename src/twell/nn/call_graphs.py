"""CUDA graphs of a layer's eager hot/cold calls, one per repeated token count (``SparseGatedMLP(eager_graphs=N)``).

Why: an eager hot/cold call costs its host 442-957 us of issuing on the GPU machines (session 40,
``scripts/op_host_time.py``; the dense chain 76-119 us), so below the default policy's eager floor (8937 tokens at
2048 x 5632, ``DispatchPolicy.eager_min_flops``) the 1.5B model's eager forward on the tables lost to dense: 0.438x /
0.570x / 0.797x at 2048 / 4096 / 6144 tokens on an H100 in session 56 (``bench_results/h100/session56_runs.md``),
although the same calls recorded in CUDA graphs (the whole backbone under ``static_dispatch``, session 49) ran 1.006x /
1.122x / 1.181x of recorded dense at 2048 / 4096 / 8192.  A replay costs the host one graph launch and the input's copy
(tens of us), whatever the kernels inside.

What a layer records: the hot/cold op (``launch_hot_cold_ffn``) reading a static input and writing a static output,
for one token count, dtype, stream, weight state, hot set and dense-row budget.  A replay copies the call's tokens in,
launches the graph and returns a fresh tensor (the static output cloned, or added to the residual: the same bits as
the fused add, ``launch_hot_cold_ffn``'s ``residual``), so nothing a caller holds is overwritten by a later replay.

Memory: the graphs of one device and stream share one CUDA graph memory pool, and their static inputs and outputs of
one shape are shared too (replays on one stream never overlap, and each call's output is copied out before the next
replay), so N recorded counts cost about one call's intermediates plus an input and an output per count, not per layer.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from .dispatch import dense_ffn_flops

__all__ = ["DEFAULT_COUNTS", "RECORDER", "RECORD_MAX_FLOPS", "RECORD_MIN_FLOPS", "STALE_CALLS", "CudaGraphRecorder",
           "GraphedCall", "LayerGraphs", "LOCK", "Recorder", "static_buffer"]

#: Bound on the token counts whose calls a layer remembers having seen (the second call of a count records it).
MAX_SEEN_COUNTS = 256

#: A recorded count that none of a layer's last this many calls in the recording window used gives its place to a new
#: count when all ``eager_graphs`` places are taken: a workload that moved on (warm-up sizes, then a serving size) gets
#: its new counts recorded, while one that cycles through more counts than places, each at least once in this many
#: calls, evicts nothing (evicting there would record on every call: an eager split and a capture each time).
STALE_CALLS = 256

#: The fewest floating-point operations (``dispatch.dense_ffn_flops``, the dense FFN's three GEMMs) of a call that is
#: recorded: 4096 tokens at 2048 x 5632.  Measured on an H100 80GB HBM3 (session 57, the 1.5B model's
#: eager forward, ``bench_results/h100/session57_runs.md``): with every layer's calls recorded the forward ran 1.197x /
#: 1.200x / 1.116x of dense at 4096 tokens in three runs and 1.18-1.22x at 6144-8192, but 0.981x / 0.916x / 0.972x at
#: 2048 and 0.946x at 1024, where the dense forward is bound by the host's issuing too and the replay's input copy and
#: output clone are extra GPU work.  Smaller calls run as without recordings (dense below the eager floor).
RECORD_MIN_FLOPS = dense_ffn_flops(4096, (2048, 5632))

#: The most floating-point operations of a call at or above the policy's eager floor that is recorded (calls below the
#: floor are recorded from RECORD_MIN_FLOPS up; 0 would record none at or above it): 12,288 tokens at 2048 x 5632.
#: Measured on an H200 (session 58, the 1.5B model's eager forward, ``bench_results/h200/session58_runs.md``): recorded,
#: 1.351x / 1.367x of dense at 12,288 tokens where the unrecorded default ran 1.242x / 1.180x (its host issuing bounds
#: it; 0.771x in a third run), but 1.355x / 1.365x at 16,384 against 1.378x / 1.400x, and 2.5-4.5 % below the default
#: at 24,576-32,768: there the replay's input copy and output read cost more GPU time than the host issuing they hide.
RECORD_MAX_FLOPS = dense_ffn_flops(12288, (2048, 5632))

#: Token counts per layer whose eager calls are recorded by default (``SparseGatedMLP(eager_graphs=...)``,
#: :func:`twell.nn.graph_eager_calls`): a fixed prefill chunk or benchmark batch and a few more, each costing a static
#: input and output per layer shape and stream (96 MB at 12,288 tokens, d=2048, bf16).
DEFAULT_COUNTS = 4

#: Held while a call is recorded or replayed: the static input and output of one shape and stream are shared by layers
#: (and by the threads that call them), so a copy in, replay and copy out must reach the stream as one block, and two
#: captures into one memory pool must not interleave.
LOCK = threading.RLock()


class Recorder(Protocol):
    """What records a call's launches and replays them (a CUDA graph on the GPU; tests substitute their own)."""

    def supports(self, device: torch.device) -> bool:
        """Whether calls on ``device`` can be recorded."""
        ...

    def stream_key(self, device: torch.device) -> Any:
        """The current stream of ``device``, as a key: graphs and their buffers are kept per stream."""
        ...

    def record(self, launch: Callable[[], None], device: torch.device) -> Callable[[], None]:
        """Record ``launch()``'s work on ``device`` and return what replays it on the current stream."""
        ...

    def synchronize(self, device: torch.device) -> None:
        """Wait for the work queued on ``device``'s current stream (before a recording is dropped)."""
        ...


class CudaGraphRecorder:
    """Records into ``torch.cuda.CUDAGraph``s captured on a side stream, one memory pool per device and stream.

    Not ``torch.cuda.graph``: its entry synchronises the device, runs ``gc.collect()`` and empties the caching
    allocator on every capture, which a model's 28 layers would each pay on their first recorded call.  Capture errors
    are confined to this thread (``capture_error_mode="thread_local"``), so another thread's CUDA calls during the
    capture do not invalidate it."""

    def __init__(self) -> None:
        self._pools: dict[Any, weakref.ref] = {}  # (device index, stream) -> the last recording there
        self._side: dict[int, torch.cuda.Stream] = {}

    def supports(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def stream_key(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device).cuda_stream

    def record(self, launch: Callable[[], None], device: torch.device) -> Callable[[], None]:
        current = torch.cuda.current_stream(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        # The pool of a live recording of this device and stream: a pool whose graphs are all gone is released, and a
        # capture into its stale handle fails an allocator assert (H100, torch 2.11, session 57)
        live = self._pools.get((index, current.cuda_stream))
        live = live() if live is not None else None
        pool = live.pool() if live is not None else torch.cuda.graph_pool_handle()
        side = self._side.get(index)
        if side is None:
            side = self._side[index] = torch.cuda.Stream(device)
        graph = torch.cuda.CUDAGraph()
        side.wait_stream(current)
        with torch.cuda.device(index), torch.cuda.stream(side):
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                launch()
            except BaseException:
                try:
                    graph.capture_end()
                except RuntimeError:
                    pass  # the capture is invalid anyway: the launch's own error is the one to report
                raise
            graph.capture_end()
        current.wait_stream(side)
        self._pools[(index, current.cuda_stream)] = weakref.ref(graph)

        def replay() -> None:
            # a graph launches on the current device's stream: a layer on another GPU than the current one (a model
            # spread over several by device_map) replays under its own
            if torch.cuda.current_device() == index:
                graph.replay()
            else:
                with torch.cuda.device(index):
                    graph.replay()

        return replay

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.current_stream(device).synchronize()


#: The recorder every layer uses (``tests/test_nn_call_graphs.py`` substitutes one that runs on the CPU).
RECORDER: Recorder = CudaGraphRecorder()

_STATIC: weakref.WeakValueDictionary[tuple[Any, ...], torch.Tensor] = weakref.WeakValueDictionary()


def static_buffer(role: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                  stream: Any) -> torch.Tensor:
    """The recorded calls' shared ``role`` buffer ("x" or "out") of this shape, dtype, device and stream; alive while a
    recording holds it.  Built with inference mode off, so calls inside and outside ``torch.inference_mode`` can
    copy into it."""
    key = (role, shape, dtype, str(device), stream)
    buf = _STATIC.get(key)
    if buf is None:
        with torch.inference_mode(False), torch.no_grad():
            buf = torch.empty(shape, dtype=dtype, device=device)
        _STATIC[key] = buf
    return buf


@dataclass
class GraphedCall:
    """One recorded call: ``replay()`` reads ``x`` and writes ``out``; ``key`` says which state it is valid for
    (the dense-row budget); ``keep`` holds what the recording reads by address (weights, the plan's copies)."""

    key: Any
    replay: Callable[[], None]
    x: torch.Tensor
    out: torch.Tensor
    keep: tuple[Any, ...]

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The recorded call on ``x`` (plus ``residual``): a fresh tensor."""
        with LOCK:
            self.x.copy_(x)
            self.replay()
            return self.out.clone() if residual is None else torch.add(residual, self.out)


class LayerGraphs:
    """One layer's recorded calls: those of the first ``limit`` token counts that came twice, all for one state
    (weights, dtype, stream: ``state``); a change of state drops them all.  Each count's recording also has a ``key``
    (its size class's hot-set plan and its dense-row budget): a call whose key moved (its class's hot set re-chosen on
    an l0 refresh call) records again in the count's place.  With every place taken, a new count is recorded only in
    the place of one that :data:`STALE_CALLS` calls have not used; otherwise it runs as without recordings."""

    __slots__ = ("calls", "clock", "device", "limit", "seen", "state", "used")

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self.calls: dict[int, GraphedCall] = {}
        self.seen: dict[int, int] = {}
        self.used: dict[int, int] = {}  # recorded count -> the clock at its last recording or replay
        self.clock = 0  # calls counted by first_call
        self.state: Any = None
        self.device: torch.device | None = None

    def first_call(self, n_tokens: int) -> bool:
        """Count a call of ``n_tokens`` tokens; True for the first one (the second of a count records it)."""
        self.clock += 1
        if n_tokens in self.seen:
            return False
        if len(self.seen) >= MAX_SEEN_COUNTS:
            self.seen.pop(next(iter(self.seen)))
        self.seen[n_tokens] = 1
        return True

    def get(self, n_tokens: int, state: Any, key: Any) -> GraphedCall | None:
        """The recorded call of ``n_tokens`` tokens valid for ``state`` and ``key``, else None (a changed ``state``
        drops every recording)."""
        if state != self.state:
            self.clear()
            self.state = state
            return None
        call = self.calls.get(n_tokens)
        if call is None or call.key != key:
            return None
        self.used[n_tokens] = self.clock
        return call

    def _stale(self) -> int | None:
        """The recorded count used longest ago, if :data:`STALE_CALLS` calls have passed since; else None."""
        if not self.used:
            return None
        count = min(self.used, key=self.used.__getitem__)
        return count if self.clock - self.used[count] >= STALE_CALLS else None

    def has_room(self, n_tokens: int) -> bool:
        """Whether a call of ``n_tokens`` tokens may be recorded (its count kept already, fewer than ``limit`` kept,
        or a stale one to replace)."""
        return n_tokens in self.calls or len(self.calls) < self.limit or self._stale() is not None

    def put(self, n_tokens: int, call: GraphedCall, device: torch.device) -> None:
        """Keep ``call`` for ``n_tokens`` tokens (replacing that count's recording, or a stale count's where every
        place is taken; ``has_room`` said yes)."""
        if not self.has_room(n_tokens):
            raise RuntimeError(f"no room for another recorded token count: {len(self.calls)} of {self.limit} kept, "
                               f"none unused for {STALE_CALLS} calls")
        drop = n_tokens if n_tokens in self.calls else (self._stale() if len(self.calls) >= self.limit else None)
        if drop is not None:
            RECORDER.synchronize(device)  # a replay still queued keeps reading what the old recording frees
            del self.calls[drop]
            del self.used[drop]
        self.calls[n_tokens] = call
        self.used[n_tokens] = self.clock
        self.device = device

    def clear(self) -> None:
        """Drop every recording (after the queued work that may still replay them)."""
        if self.calls and self.device is not None:
            RECORDER.synchronize(self.device)
        self.calls.clear()
        self.used.clear()
        self.state = None
