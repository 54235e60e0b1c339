"""The training loop of the recipe: LM loss + L1 on the sparse FFNs, dead-unit revival, eval, checkpoints, DDP.

Optimisation follows the published recipe: AdamW with betas (0.9, 0.95), weight decay 0.1 on matrices
(not on norms' gains), gradient clipping at 1.0, a linear warm-up then cosine decay to 10 % of the peak
learning rate.  The paper changes nothing else for the sparse models, so only the L1 term
(``coef * mean over sparse layers of last_l1``, :mod:`twell.train.l1`) and the dead-unit revival
(:mod:`twell.train.dead_units`) are added.  Peak learning rates per preset are ordinary values for
those sizes (tiny 3e-3 ... 1.5b 2e-4), not published numbers; override with ``lr``.

Determinism: the batch of a step is a pure function of ``(seed, step, rank)``, the revival noise of
``(seed, step)``, the learning rate of the step; a checkpoint holds the model, AdamW state, the dead-unit
counters and the logs, so on the CPU a resumed run reproduces the continuous run's losses bit for bit
(tested).

Multi-process: launched with ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) the loop initialises
``torch.distributed`` (NCCL on CUDA, gloo on CPU), wraps the model in DDP, gives each rank its slice of
the global batch, all-reduces the logged scalars and the dead-unit counters, and writes checkpoints and
logs from rank 0.

Precision: fp32 on the CPU.  On CUDA ``precision="auto"`` stores the model in bf16 and computes the loss
in fp32; AdamW then updates bf16 weights, which is fine for the short runs this loop is meant for but
not a mixed-precision master-weight setup.  ``precision="autocast"`` is that setup: fp32 parameters
and optimizer state, forward (training and evaluation) under ``torch.autocast(dtype=bfloat16)``.  The
sparse layers' dtype check still passes there (their input, the normed fp32 residual stream, has the
weights' dtype) and the dense training FFN's matmuls run in bf16 through autocast, its elementwise
work and the L1 sum in fp32.  ``fused_adamw`` selects PyTorch's fused AdamW kernel (CUDA).

Compilation: ``compile=True`` runs the training forward (and so its backward) through ``torch.compile`` (inductor on
CUDA; ``aot_eager`` on the CPU, where it checks the path rather than speeding it up).  The sparse layers' hot/cold
training op is a custom op the graph keeps; what must see real tensors runs eagerly inside the step, at one graph
break each: a layer's hot-set choice (:meth:`twell.nn.SparseGatedMLP._training_hot_set`) and the dead-unit monitor's
gate hook (:class:`twell.train.hooks.GateMonitor`).  Evaluation runs the model uncompiled.  On an H100 (session 55,
``bench_results/h100/session55_runs.md``) the 1.5B benchmark model's compiled hot/cold step ran 1.403x of the
compiled dense step at 8 x 2048 tokens, the eager one 1.460x of eager dense.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..nn.mlp import TRAIN_IMPLS
from .data import TokenData, batch_at, prepare_data
from .dead_units import DeadUnitTracker, revive_dead_units
from .hooks import GateMonitor
from .l1 import DEFAULT_L1_COEF, L1Schedule, l1_term, sparse_layers
from .model import PRESETS, ModelSpec, build_model, count_parameters

__all__ = ["DEFAULT_LR", "PRECISIONS", "TrainConfig", "TrainResult", "evaluate", "load_checkpoint", "lr_at", "train"]

#: ``TrainConfig.precision`` values (see the module docs).
PRECISIONS = ("auto", "fp32", "bf16", "autocast")

#: Peak learning rate per preset when ``TrainConfig.lr`` is None (common values for these sizes; tiny's
#: 3e-3 was the fastest stable choice of {1e-3, 3e-3, 1e-2} in 200-step CPU runs).
DEFAULT_LR = {"tiny": 3e-3, "25m": 1e-3, "125m": 6e-4, "0.5b": 3e-4, "1.5b": 2e-4}


@dataclass
class TrainConfig:
    """Everything a run needs; ``twell train --help`` lists the same options."""

    preset: str = "tiny"
    arch: str = "auto"  # "auto" (twell.models if importable, else the built-in TinyLlama), "hf", "builtin"
    steps: int = 200
    batch_size: int = 16  # sequences per process and step
    seq_len: int = 128
    lr: float | None = None  # None: DEFAULT_LR[preset]
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    warmup_steps: int | None = None  # None: 10 % of steps, at most 2000
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    l1_coef: float = DEFAULT_L1_COEF
    l1_warmup_steps: int = 0
    revive: bool = True
    revive_weight: float = 0.1
    revive_std: float = 0.02
    # Where the revival noise is drawn: "cpu" (the same rows on every device and rank) or "model" (the
    # parameters' device: no host work per step, which matters when thousands of rows are dead).
    revive_noise_device: str = "cpu"
    dead_window_tokens: int = 1 << 20
    track_dead: bool = True
    eval_every: int = 50  # 0: only at the end
    eval_batches: int = 8
    log_every: int = 1  # keep every n-th step's log
    out_dir: str | None = None  # train_log.json goes here
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # 0: only at the end (when checkpoint_dir is set)
    resume_from: str | None = None
    data_paths: list[str] | None = None  # None: the standard library's source
    vocab_size: int = 4096
    max_bytes: int | None = 4_000_000
    data_cache_dir: str | None = None
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "autocast" (fp32 + bf16 autocast)
    fused_adamw: bool = False  # torch.optim.AdamW(fused=True): one kernel for all parameters (CUDA)
    train_ffn: str = "auto"  # SparseGatedMLP.train_impl for every layer (TRAIN_IMPLS: "auto", "hot-cold", ...)
    compile: bool = False  # the training forward through torch.compile (see the module docs)
    model_overrides: dict[str, Any] = field(default_factory=dict)  # e.g. {"n_layers": 2}
    progress: bool = True

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got {self.preset!r}")
        for name in ("steps", "batch_size", "seq_len", "eval_batches", "log_every", "dead_window_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {self.precision!r}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be a bool, got {self.compile!r}")
        if self.revive_noise_device not in ("cpu", "model"):
            raise ValueError(f"revive_noise_device must be 'cpu' or 'model'; got {self.revive_noise_device!r}")
        self.betas = tuple(self.betas)  # type: ignore[assignment]

    @property
    def peak_lr(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.preset]

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else min(2000, max(1, self.steps // 10))

    def model_spec(self, vocab_size: int) -> ModelSpec:
        spec = dataclasses.replace(PRESETS[self.preset], vocab_size=vocab_size,
                                   max_seq_len=max(self.seq_len, PRESETS[self.preset].max_seq_len))
        return dataclasses.replace(spec, **self.model_overrides)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d


@dataclass
class TrainResult:
    model: nn.Module
    logs: list[dict[str, Any]]
    eval_logs: list[dict[str, Any]]
    final_eval_loss: float | None
    tokens: int
    seconds: float
    dead_fractions: list[float]
    n_params: int
    config: TrainConfig


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up over ``warmup`` steps (step 0 gets peak/warmup), then cosine to ``min_lr_ratio * peak``."""
    peak, w = config.peak_lr, config.warmup
    if step < w:
        return peak * (step + 1) / w
    progress = min(1.0, (step - w) / max(1, config.steps - w))
    return peak * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


# ----------------------------------------------------------------------------------------- distributed
def _dist_setup(device_pref: str) -> tuple[int, int, torch.device, bool]:
    """(rank, world, device, we_initialised) from torchrun's env vars; a single process otherwise."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if device_pref == "auto":
        dev_type = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        dev_type = torch.device(device_pref).type
    if world <= 1 and not (dist.is_available() and dist.is_initialized()):
        return 0, 1, torch.device(device_pref if device_pref != "auto" else dev_type), False
    created = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev_type == "cuda" else "gloo")
        created = True
    rank, world = dist.get_rank(), dist.get_world_size()
    if dev_type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count())))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local), created
    return rank, world, torch.device("cpu"), created


def _all_mean(values: list[float], world: int, device: torch.device) -> list[float]:
    if world <= 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return (t / world).cpu().tolist()


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast for ``precision="autocast"``, else nothing."""
    if precision == "autocast":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------- evaluation
def _lm_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of ``[B, T + 1]`` blocks; the model returns logits or an object with ``.logits``."""
    out = model(ids[:, :-1])
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def evaluate(model: nn.Module, blocks: torch.Tensor, *, batch_size: int, n_batches: int, device: torch.device,
             rank: int = 0, world: int = 1, precision: str = "fp32") -> float:
    """Mean LM loss over the first ``n_batches * batch_size * world`` held-out blocks (fixed set, in order).

    ``precision="autocast"`` runs the forwards under bf16 autocast (as the training forwards of that mode).
    """
    was = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), _autocast(precision, device):
        for b in range(n_batches):
            start = (b * world + rank) * batch_size
            if start >= blocks.shape[0]:
                break
            ids = blocks[start:start + batch_size].to(device)
            total += float(_lm_loss(model, ids)) * ids.shape[0]
            count += ids.shape[0]
    model.train(was)
    s, c = _all_sum([total, float(count)], world, device)
    return s / max(1.0, c)


def _all_sum(values: list[float], world: int, device: torch.device) -> list[float]:
    if world <= 1:
        return values
    return [v * world for v in _all_mean(values, world, device)]


# ----------------------------------------------------------------------------------------- checkpoints
def _save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int,
                     tracker: DeadUnitTracker | None, logs: list[dict[str, Any]], eval_logs: list[dict[str, Any]],
                     config: TrainConfig) -> Path:
    """``path/step_{step:07d}/``: ``model/`` (``save_pretrained``) or ``model.pt`` (state_dict), plus
    ``trainer.pt`` (optimizer, step, dead-unit counters, logs, config); ``path/latest`` names it."""
    d = path / f"step_{step:07d}"
    d.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(d / "model")
    else:
        torch.save(model.state_dict(), d / "model.pt")
    torch.save(
        {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "tracker": tracker.state_dict() if tracker is not None else None,
            "logs": logs,
            "eval_logs": eval_logs,
            "config": config.to_dict(),
        },
        d / "trainer.pt",
    )
    (path / "latest").write_text(d.name)
    return d


def _resolve_checkpoint(path: str | Path) -> Path:
    p = Path(path)
    if (p / "latest").exists():
        p = p / (p / "latest").read_text().strip()
    if not (p / "trainer.pt").exists():
        raise FileNotFoundError(f"no checkpoint (trainer.pt) in {p}")
    return p


def load_checkpoint(path: str | Path, model: nn.Module) -> dict[str, Any]:
    """Load the weights of checkpoint ``path`` (a step dir, or a checkpoint dir with ``latest``) into
    ``model`` in place and return the trainer state dict (optimizer, step, tracker, logs, config)."""
    p = _resolve_checkpoint(path)
    if (p / "model.pt").exists():
        state = torch.load(p / "model.pt", map_location="cpu", weights_only=True)
    else:
        loaded = type(model).from_pretrained(p / "model")  # type: ignore[attr-defined]
        state = loaded.state_dict()
    model.load_state_dict(state)
    return torch.load(p / "trainer.pt", map_location="cpu", weights_only=False)


# ----------------------------------------------------------------------------------------- the loop
def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices/embeddings (dim >= 2) only, not on norm gains (published practice)."""
    seen: set[int] = set()
    decay, no_decay = [], []
    for p in model.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def train(
    config: TrainConfig,
    *,
    data: TokenData | None = None,
    model_fn: Callable[[ModelSpec], nn.Module] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> TrainResult:
    """Run ``config`` and return the trained model (unwrapped from DDP), logs and summary (see module docs).

    ``data``: pre-tokenized data (else :func:`prepare_data` from the config).  ``model_fn(spec)``: builds the
    model instead of :func:`build_model` (any module with ``SparseGatedMLP`` layers whose forward maps
    ``[B, T]`` ids to logits or to an object with ``.logits``); it is called after ``torch.manual_seed(seed)``.
    ``on_step(record)``: called on rank 0 after every logged step (and its evaluation, if any) with that
    step's log record, e.g. to write partial results or time steps; it must not change the record.
    """
    from tqdm.auto import tqdm

    rank, world, device, created_pg = _dist_setup(config.device)
    finished = False
    try:
        if data is None:
            if rank == 0:
                data = prepare_data(config.data_paths, seq_len=config.seq_len, vocab_size=config.vocab_size,
                                    max_bytes=config.max_bytes, cache_dir=config.data_cache_dir)
            _barrier(world)
            if rank != 0:  # the cache is now warm
                data = prepare_data(config.data_paths, seq_len=config.seq_len, vocab_size=config.vocab_size,
                                    max_bytes=config.max_bytes, cache_dir=config.data_cache_dir)
        assert data is not None
        spec = config.model_spec(data.vocab_size)
        if model_fn is None:
            model = build_model(spec, arch=config.arch, seed=config.seed)
        else:
            torch.manual_seed(config.seed)
            model = model_fn(spec)
        # "autocast" keeps fp32 parameters: autocast casts them per matmul.
        bf16 = config.precision == "bf16" or (config.precision == "auto" and device.type == "cuda")
        model.to(device=device, dtype=torch.bfloat16 if bf16 else torch.float32)
        layers = sparse_layers(model)
        if not layers:
            raise ValueError("the model has no SparseGatedMLP layers")
        if config.train_ffn not in TRAIN_IMPLS:
            raise ValueError(f"train_ffn must be one of {', '.join(TRAIN_IMPLS)}; got {config.train_ffn!r}")
        for layer in layers:
            layer.train_impl = config.train_ffn
        monitor = GateMonitor(model) if config.track_dead else None
        tracker = DeadUnitTracker(model, config.dead_window_tokens, monitor) if monitor is not None else None
        impl = {"fused": True} if config.fused_adamw else {"foreach": True}
        optimizer = torch.optim.AdamW(_param_groups(model, config.weight_decay), lr=config.peak_lr,
                                      betas=config.betas, weight_decay=config.weight_decay, **impl)
        l1_sched = L1Schedule(config.l1_coef, config.l1_warmup_steps)
        logs: list[dict[str, Any]] = []
        eval_logs: list[dict[str, Any]] = []
        start = 0
        if config.resume_from:
            state = load_checkpoint(config.resume_from, model)
            optimizer.load_state_dict(state["optimizer"])
            if tracker is not None and state.get("tracker") is not None:
                tracker.load_state_dict(state["tracker"])
            start = int(state["step"])
            logs, eval_logs = list(state["logs"]), list(state["eval_logs"])
        run_model: nn.Module = model
        if world > 1:
            run_model = nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
        if config.compile:
            run_model = torch.compile(run_model, backend="inductor" if device.type == "cuda" else "aot_eager")
        model.train()
        t0 = time.perf_counter()
        bar = tqdm(range(start, config.steps), initial=start, total=config.steps, disable=not config.progress or rank,
                   desc=f"train {config.preset}", dynamic_ncols=True,
                   # in a log file every refresh is another line's worth of text: refresh every 10 s there
                   mininterval=0.1 if sys.stderr.isatty() else 10.0)
        tokens_per_step = config.batch_size * config.seq_len * world
        for step in bar:
            lr = lr_at(step, config)
            for g in optimizer.param_groups:
                g["lr"] = lr
            ids = batch_at(data.train, step, config.batch_size, seed=config.seed, rank=rank,
                           world_size=world).to(device)
            with _autocast(config.precision, device):
                lm = _lm_loss(run_model, ids)
            l1 = l1_term(layers)
            coef = l1_sched(step)
            loss = lm + coef * l1
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            revived = 0
            if tracker is not None:
                tracker.step()
                if config.revive:
                    gen_device = device if config.revive_noise_device == "model" else torch.device("cpu")
                    gen = torch.Generator(device=gen_device).manual_seed(config.seed * 1_000_003 + step)
                    revived = revive_dead_units(tracker, model, config.revive_weight, config.revive_std, gen)
            if step % config.log_every == 0 or step + 1 == config.steps:
                l0s = [float(m.last_l0) if m.last_l0 is not None else float("nan") for m in layers]
                scalars = [float(loss.detach()), float(lm.detach()), float(l1.detach()), float(gnorm), *l0s]
                vals = _all_mean(scalars, world, device)
                rec: dict[str, Any] = {
                    "step": step + 1,
                    "tokens": (step + 1) * tokens_per_step,
                    "lr": lr,
                    "loss": vals[0],
                    "lm_loss": vals[1],
                    "l1": vals[2],
                    "l1_coef": coef,
                    "grad_norm": vals[3],
                    "l0": sum(vals[4:]) / len(l0s),
                    "l0_layers": vals[4:],
                    "dead_fraction": tracker.dead_fraction() if tracker is not None else None,
                    "dead_layers": tracker.dead_fractions() if tracker is not None else None,
                    "revived": revived,
                }
                logs.append(rec)
                bar.set_postfix(loss=f"{rec['lm_loss']:.3f}", l0=f"{rec['l0']:.1f}",
                                dead=f"{rec['dead_fraction'] or 0:.2f}", refresh=False)
            last = step + 1 == config.steps
            if (config.eval_every and (step + 1) % config.eval_every == 0) or last:
                ev = evaluate(model, data.heldout, batch_size=config.batch_size, n_batches=config.eval_batches,
                              device=device, rank=rank, world=world, precision=config.precision)
                eval_logs.append({"step": step + 1, "eval_loss": ev})
                if logs and logs[-1]["step"] == step + 1:
                    logs[-1]["eval_loss"] = ev
            if on_step is not None and rank == 0 and logs and logs[-1]["step"] == step + 1:
                on_step(logs[-1])
            if config.checkpoint_dir and (last or (config.checkpoint_every and (step + 1) % config.checkpoint_every
                                                   == 0)):
                if rank == 0:
                    _save_checkpoint(Path(config.checkpoint_dir), model, optimizer, step + 1, tracker, logs,
                                     eval_logs, config)
                _barrier(world)
        bar.close()
        seconds = time.perf_counter() - t0
        result = TrainResult(
            model=model,
            logs=logs,
            eval_logs=eval_logs,
            final_eval_loss=eval_logs[-1]["eval_loss"] if eval_logs else None,
            tokens=(config.steps - start) * tokens_per_step,
            seconds=seconds,
            dead_fractions=tracker.dead_fractions() if tracker is not None else [],
            n_params=count_parameters(model),
            config=config,
        )
        if config.out_dir and rank == 0:
            out = Path(config.out_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / "train_log.json").write_text(json.dumps(
                {"config": config.to_dict(), "n_params": result.n_params, "world_size": world,
                 "seconds": seconds, "logs": logs, "eval_logs": eval_logs}, indent=1))
        if monitor is not None:
            monitor.close()
        finished = True
        return result
    finally:
        if created_pg:
            import gc

            import torch.distributed as dist

            # The DDP wrapper goes before the process group.  Freed after destroy_process_group (when this frame
            # ended), its reducer dropped the gloo group's last reference from Python: the group's destructor then
            # joined its worker threads with the GIL held while a worker waited for the GIL to free a tensor of its
            # last work.  A deadlock; the two-process CPU test hung so in session 40's CI run (rank 1 in
            # ~ProcessGroupGloo under ~Reducer, its pt_gloo_runloop thread in take_gil).  Freed here, the reducer
            # drops a reference the registry still backs, and after a barrier no worker holds a tensor of ours.
            run_model = None  # noqa: F841 - the DDP wrapper's last reference
            gc.collect()
            if finished:  # on an error another rank may never reach a barrier
                _barrier(world)
            dist.destroy_process_group()
