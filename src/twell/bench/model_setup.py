"""The models of ``twell bench model``: published shapes, built on the device, and swappable MLP sets.

* :data:`PRESETS`: the SparseLM shapes of the paper (hidden 2048, FFN 5632, 32 heads of 64, no GQA, vocab
  49,152, tied embeddings, no biases, RMSNorm; 8 / 18 / 28 / 38 layers) and ``tiny`` (hidden 64, 2 layers)
  for CPU tests.  They are :class:`~twell.train.model.ModelSpec` values, the shape type of ``twell train``.
* :func:`build_model`: a randomly initialised :class:`~twell.models.TwellLlamaForCausalLM` with SDPA
  attention, allocated directly on the target device in the benchmark dtype (a 1.5B model initialised on
  the CPU in float32 would take longer than the whole benchmark).
* :class:`MlpSets`: for every decoder layer, several MLP modules that share the layer's three
  ``nn.Linear`` modules (so one copy of the weights): the dense ReLU FFN (``"dense"``, what
  :func:`twell.models.revert` builds) and the :class:`~twell.nn.SparseGatedMLP` under each requested
  dispatch policy (``"sparse:default"``, ``"sparse:always-sparse"``).  :meth:`MlpSets.use` swaps a set in
  by attribute assignment, so dense and sparse runs alternate within one process on identical weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..models import TwellLlamaConfig, TwellLlamaForCausalLM, apply, revert
from ..nn import (
    DEFAULT_POLICY,
    DispatchPolicy,
    SparseGatedMLP,
    fuse_qkv,
    fuse_residual_adds,
    fuse_rms_norms,
    fuse_rotary,
)
from ..nn.call_graphs import DEFAULT_COUNTS
from ..ops import DECODE_MAX_TOKENS
from ..train.model import ModelSpec
from .model_measure import synchronize
from .model_sparsity import SparsityTarget, calibrate, install_bias_channel

__all__ = ["DEFAULT_L0", "GRAPHED", "POLICIES", "PRESETS", "BenchModel", "MlpSets", "build_model", "make_tokens",
           "prepare", "set_policy"]

#: Published shapes (paper table: 0.5B / 1B / 1.5B / 2B differ only in depth) and a CPU test model.
PRESETS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(hidden_size=64, n_layers=2, n_heads=4, intermediate_size=176, vocab_size=512),
    "0.5b": ModelSpec(hidden_size=2048, n_layers=8, n_heads=32, intermediate_size=5632),
    "1b": ModelSpec(hidden_size=2048, n_layers=18, n_heads=32, intermediate_size=5632),
    "1.5b": ModelSpec(hidden_size=2048, n_layers=28, n_heads=32, intermediate_size=5632),
    "2b": ModelSpec(hidden_size=2048, n_layers=38, n_heads=32, intermediate_size=5632),
}

#: Default target mean l0 (active units per token, averaged over layers).  29 of 5632 is the published
#: 1.5B figure (0.5 %); the tiny model gets 8 of 176 so that its calibration has something to resolve.
DEFAULT_L0: dict[str, float] = {"tiny": 8.0, "0.5b": 29.0, "1b": 29.0, "1.5b": 29.0, "2b": 29.0}

#: Dispatch policies a sparse set can run under (``--forward-policies`` / ``--decode-policies``).
POLICIES: dict[str, DispatchPolicy] = {
    "default": DEFAULT_POLICY,
    # the default tables with no floor for eager calls (the default policy before session 43)
    "tables": DEFAULT_POLICY.without_eager_floor(),
    "always-sparse": DispatchPolicy.always_sparse(),
    # the default table plus the small-batch kernels for calls of 1 to 64 tokens (decode steps); like the
    # table, only for the measured layer shape (the published presets have it, "tiny" does not); no eager floor,
    # which would send every such call dense
    "decode": dataclasses.replace(DEFAULT_POLICY.without_eager_floor(), decode_max_tokens=DECODE_MAX_TOKENS),
    # the small-batch kernels for one-token calls only: graphed, the one-pass kernel beats the dense chain
    # at M=1 (1.78x at 0.5 %, 1.45x at 2 %; bench_results/h200/decode_probe_onepass_session6.log); from two
    # tokens the batch kernels (session 33) win or lose by density and token count
    # (decode_probe_final_call6_session33.log)
    "decode-1": dataclasses.replace(DEFAULT_POLICY.without_eager_floor(), decode_max_tokens=1),
}


#: A set name's suffix for the policy's layers with ``eager_graphs`` on (``"default+graphs"``: the default policy, every
#: layer recording its eager calls, :data:`twell.nn.call_graphs.DEFAULT_COUNTS` token counts: what a model's layers do
#: by default).  A set without it has the recordings off (``eager_graphs=0``), so that it times the policy's paths.
GRAPHED = "+graphs"


def set_policy(name: str) -> str:
    """The dispatch policy of sparse set ``name`` (a :data:`POLICIES` key, optionally with the :data:`GRAPHED` suffix);
    ``ValueError`` naming the accepted names for anything else."""
    policy = name.removesuffix(GRAPHED)
    if policy not in POLICIES:
        raise ValueError(f"unknown dispatch policy {name!r}; choose from {', '.join(POLICIES)}, each optionally with "
                         f"{GRAPHED!r} (eager calls recorded in CUDA graphs)")
    return policy


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(
    spec: ModelSpec,
    *,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    backend: str = "auto",
    max_positions: int = 2048,
) -> TwellLlamaForCausalLM:
    """A random-init :class:`TwellLlamaForCausalLM` of shape ``spec`` on ``device`` in ``dtype``, eval mode.

    Parameters are created on ``device`` with ``dtype`` as the default dtype, so nothing is allocated on
    the CPU or in float32 first; transformers' own initialiser (normal, std ``initializer_range`` = 0.02)
    runs there, seeded by ``seed`` (``torch.manual_seed`` seeds the CUDA generators too, so every process
    of one benchmark builds bit-identical weights).  ``l1_coef`` is 0 in the config because the training
    benchmark adds the L1 term itself, identically for the dense and the sparse FFN.
    """
    config = TwellLlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_heads,
        max_position_embeddings=max(max_positions, spec.max_seq_len),
        tie_word_embeddings=True,
        attn_implementation="sdpa",
        twell_backend=backend,
        l1_coef=0.0,
    )
    torch.manual_seed(seed)
    with _default_dtype(dtype), torch.device(device):
        model = TwellLlamaForCausalLM(config)
    return model.to(dtype).eval()


def make_tokens(n_seqs: int, seq_len: int, vocab_size: int, *, seed: int, device: torch.device) -> torch.Tensor:
    """Uniform random token ids ``[n_seqs, seq_len]``, drawn on the CPU (same ids on every device)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n_seqs, seq_len), generator=gen).to(device)


class MlpSets:
    """Named lists of per-layer MLP modules that share the decoder layers' weights (see the module docs).

    Built from a model whose layers hold :class:`SparseGatedMLP` (the config's options, default policy):
    those become ``"sparse:default"``; :func:`twell.models.revert` gives ``"dense"``
    (:class:`~twell.nn.DenseReluGatedMLP`); :func:`twell.models.apply` with another policy gives
    ``"sparse:<policy>"``, and a name with the :data:`GRAPHED` suffix that policy's layers with ``eager_graphs`` on
    (``"sparse:default+graphs"``); the sets without it have ``eager_graphs=0``.  The ``"dense"`` set is active when
    the constructor returns.
    """

    def __init__(self, model: nn.Module, policies: Sequence[str] = ("default",)) -> None:
        for name in policies:
            set_policy(name)
        self.layers = model.model.layers
        base = [layer.mlp for layer in self.layers]
        if not all(isinstance(m, SparseGatedMLP) for m in base):
            raise TypeError("MlpSets needs a model whose decoder MLPs are all SparseGatedMLP (a twell model)")
        first = base[0]
        options = {"backend": first.backend, "tile": first.tile, "capacity": first.capacity,
                   "precision": first.precision}
        self._model, self._options = model, options
        revert(model)
        self.sets: dict[str, list[nn.Module]] = {"dense": [layer.mlp for layer in self.layers]}
        for name in policies:
            if name == "default":
                for m in base:
                    m.eager_graphs = 0
                self.sets["sparse:default"] = base
                continue
            graphs = DEFAULT_COUNTS if name.endswith(GRAPHED) else 0
            self.add_converted(f"sparse:{name}", set_policy(name), eager_graphs=graphs)
        self.use("dense")

    def add_converted(self, name: str, policy: str, **mlp_kwargs: object) -> list[nn.Module]:
        """Register set ``name``: :class:`SparseGatedMLP` layers sharing the weights, under ``POLICIES[policy]``,
        with the base set's backend, tile, capacity and precision plus ``mlp_kwargs`` (``eager_graphs``: the layer
        default unless given); the ``"dense"`` set is active after."""
        if policy not in POLICIES:
            raise ValueError(f"unknown dispatch policy {policy!r}; choose from {', '.join(POLICIES)}")
        if name in self.sets:
            raise ValueError(f"set {name!r} exists already")
        self.use("dense")
        apply(self._model, policy=POLICIES[policy], **self._options, **mlp_kwargs)
        self.sets[name] = [layer.mlp for layer in self.layers]
        self.use("dense")
        return self.sets[name]

    def add(self, name: str, modules: list[nn.Module]) -> None:
        """Register another set (one module per layer, sharing the weights)."""
        if len(modules) != len(self.layers):
            raise ValueError(f"set {name!r} has {len(modules)} modules for {len(self.layers)} layers")
        self.sets[name] = modules

    def use(self, name: str) -> list[nn.Module]:
        """Put set ``name`` into the decoder layers; returns its modules."""
        if name not in self.sets:
            raise KeyError(f"no MLP set {name!r}; have {', '.join(self.sets)}")
        for layer, mlp in zip(self.layers, self.sets[name], strict=True):
            layer.mlp = mlp
        return self.sets[name]


@dataclass
class BenchModel:
    """A benchmark model ready to run: weights calibrated, MLP sets built, the benchmark token batch."""

    preset: str
    spec: ModelSpec
    model: nn.Module
    sets: MlpSets
    tokens: torch.Tensor
    device: torch.device
    dtype: torch.dtype
    target: SparsityTarget
    calibration: list[dict[str, float]]
    seconds: dict[str, float]


def prepare(
    preset: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    batch: int,
    seq: int,
    target: SparsityTarget,
    policies: Sequence[str],
    seed: int = 0,
    backend: str = "auto",
    max_positions: int = 2048,
    fused_norms: bool = False,
    fused_rope: bool = False,
    fused_qkv: bool = False,
    fused_residual: bool = False,
) -> BenchModel:
    """Build the preset's model, give it the target sparsity (:mod:`twell.bench.model_sparsity`) calibrated
    on the benchmark batch ``[batch, seq]`` itself, and build its MLP sets.  Deterministic in ``seed``.

    ``fused_norms``: the model's RMSNorms run through ``F.rms_norm`` (:func:`twell.nn.fuse_rms_norms`),
    for every variant alike, before the calibration (so the thresholds match what runs).  ``fused_rope``: the
    rotary embedding in one Triton pass per tensor (:func:`twell.nn.fuse_rotary`, process-wide; forward bits
    unchanged).  ``fused_qkv``: each attention layer's q, k and v projections as one GEMM
    (:func:`twell.nn.fuse_qkv`), every variant alike, before the calibration.  ``fused_residual``: the decoder
    layers' residual adds fused (:func:`twell.nn.fuse_residual_adds`: the MLP's in the hot/cold op's gather, the
    attention's with the post-attention norm where that is a FusedRMSNorm), every variant alike."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    spec = PRESETS[preset]
    t0 = time.perf_counter()
    model = build_model(spec, device=device, dtype=dtype, seed=seed, backend=backend,
                        max_positions=max(max_positions, seq))
    if fused_norms:
        fuse_rms_norms(model)
    if fused_rope:
        fuse_rotary()
    if fused_qkv:
        fuse_qkv(model)
    if fused_residual:
        fuse_residual_adds(model)
    sets = MlpSets(model, policies)
    synchronize(device)
    t1 = time.perf_counter()
    tokens = make_tokens(batch, seq, spec.vocab_size, seed=seed + 1, device=device)
    install_bias_channel(model, float(model.config.initializer_range))
    probs = target.unit_probabilities(spec.n_layers, spec.intermediate_size, seed=seed + 2)
    calibration = calibrate(model, sets.use("dense"), tokens, probs)
    synchronize(device)
    seconds = {"build_s": t1 - t0, "calibrate_s": time.perf_counter() - t1}
    return BenchModel(preset, spec, model, sets, tokens, device, dtype, target, calibration, seconds)
