"""``twell bench model``: whole-model benchmarks, dense ReLU FFN vs the sparse TwELL FFN, one model.

Parts (``--parts``, default all three; they always run in this order):

* ``forward``: backbone forward at ``--batch`` x ``--seq`` tokens (64 x 2048), tokens/ms, speedup, peak
  memory, energy per token, per-layer l0, output check (:mod:`twell.bench.model_forward`);
* ``decode``: greedy ``generate`` with the KV cache at batch 1, 8, 64 (:mod:`twell.bench.model_decode`);
* ``train``: forward + backward + AdamW step, dense vs ``--train-impl`` (:mod:`twell.bench.model_train`).
  Last, because the Triton training kernels are the least tested code here.

Each sparse variant runs under a dispatch policy (``--forward-policies``, ``--decode-policies``):
``default`` (the default policy: the measured H200 table, so dense where the table says dense, e.g. at decode
token counts, and below its eager floor), ``decode`` (that table plus the small-batch kernels of
:mod:`twell.ops.decode` for calls of 1 to 64 tokens) and ``always-sparse`` (the TwELL kernels in every
layer and call).  A name ending in ``+graphs`` has the layers record their eager calls in CUDA graphs
(``SparseGatedMLP(eager_graphs=4)``, :mod:`twell.nn.call_graphs`); without it the recordings are off, so
``default+graphs`` is what a :class:`~twell.nn.SparseGatedMLP` user gets.

The model (:mod:`twell.bench.model_setup`) is a randomly initialised TwellLlama of a published shape,
given realistic activation sparsity by the calibration of :mod:`twell.bench.model_sparsity` (read its
docstring: the method is stored in the result JSON too).  The dense baseline is the same model with the
dense ReLU FFN; attention and everything else are the same modules.

Robustness: on CUDA each part runs in its own child process (``--isolation``), which
builds the same model from the same seed (a few seconds), writes its results to a JSON file after every
finished piece, and is killed after ``--part-timeout`` seconds.  A crash (an illegal memory access in a
kernel leaves the CUDA context unusable; a segfault ends the process) or a hang then costs only that part,
and what it finished before is kept.  Inside a part, a failing variant is recorded with its error and the
others go on.

Output under ``--out``: ``<stem>.json`` (environment, arguments, sparsity method, per-part details),
``<stem>.csv`` (one row per part, variant and batch), ``<stem>_layers.png`` (per-layer l0) when
matplotlib is installed, the child files under ``<stem>_parts/``, and a table printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from .._io import write_json_atomic
from ..nn import FusedRMSNorm, qkv_fused, residual_adds_fused
from ..nn.rope import rotary_fused
from ..ops import hot_cold_plan
from .environment import environment
from .model_decode import DecodeConfig, run_decode
from .model_forward import COMPILE_MODES, ForwardConfig, run_forward
from .model_measure import describe_error
from .model_report import part_rows, plot_layers, summary_table
from .model_setup import DEFAULT_L0, GRAPHED, POLICIES, PRESETS, BenchModel, prepare, set_policy
from .model_sparsity import METHOD, SparsityTarget
from .model_train import TrainConfig, run_train
from .results import write_results

__all__ = ["PARTS", "main"]

PARTS = ("forward", "decode", "train")


def _csv(kind: type) -> Any:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}, got {text!r}") from None

    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="twell bench model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=list(PRESETS), default="1.5b")
    p.add_argument("--parts", type=_csv(str), default=PARTS, help="comma-separated subset of forward,decode,train")
    p.add_argument("--batch", type=int, default=64, help="sequences of the forward batch (also the calibration batch)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length of the forward and training batches")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--backend", choices=["auto", "torch", "triton"], default="auto", help="sparse inference backend")
    p.add_argument("--fused-norms", action="store_true",
                   help="run the model's RMSNorms through F.rms_norm (twell.nn.fuse_rms_norms), every variant alike")
    p.add_argument("--fused-rope", action="store_true",
                   help="rotary embedding in one Triton pass per tensor (twell.nn.fuse_rotary; transformers' "
                        "forward bits), every variant alike")
    p.add_argument("--fused-qkv", action="store_true",
                   help="each attention layer's q, k and v projections as one GEMM (twell.nn.fuse_qkv), every "
                        "variant alike")
    p.add_argument("--fused-residual", action="store_true",
                   help="decoder layers' residual adds fused (twell.nn.fuse_residual_adds): the MLP's in the TwELL "
                        "gather, the attention's with the next norm (with --fused-norms), every variant alike")
    p.add_argument("--fused-gate", action=argparse.BooleanOptionalAction, default=True,
                   help="sparse layers' hot/cold split with its GEMM, hot hidden state and cold pack in one kernel "
                        "(twell.ops.hot_cold_gate_kernel; bf16/fp16; on by default)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("sparsity (see twell.bench.model_sparsity)")
    g.add_argument("--l0", type=float, default=None, help="target mean active units per token (default: per preset)")
    g.add_argument("--dead-fraction", type=float, default=0.3)
    g.add_argument("--tail-exponent", type=float, default=1.0, help="Zipf exponent of unit frequencies")
    g.add_argument("--peak-ratio", type=float, default=3.0, help="densest / sparsest layer weight (layer_profiles)")
    g = p.add_argument_group("forward")
    g.add_argument("--forward-policies", type=_csv(str), default=("default", f"default{GRAPHED}", "always-sparse"),
                   help=f"dispatch policies of the sparse variants ({', '.join(POLICIES)}); a name ending in "
                        f"'{GRAPHED}' has the layers record their eager calls in CUDA graphs (as layers do by "
                        "default), one without it has them off")
    g.add_argument("--warmup", type=int, default=2)
    g.add_argument("--reps", type=int, default=5)
    g.add_argument("--energy-seconds", type=float, default=3.0, help="energy window per variant (0: skip)")
    g.add_argument("--check-seqs", type=int, default=2, help="sequences checked against a float32 copy (0: skip)")
    g.add_argument("--forward-profile", action="store_true",
                   help="profile one more forward per variant (CUDA): its largest kernels, kernel vs wall time")
    g.add_argument("--forward-compile", action="store_true",
                   help="also time every variant's backbone under torch.compile (one variant after another)")
    g.add_argument("--forward-compile-mode", choices=COMPILE_MODES, default="default",
                   help="torch.compile mode of --forward-compile; reduce-overhead (CUDA graphs) traces and calls the "
                        "variants inside twell.nn.static_dispatch")
    g.add_argument("--forward-cached-weights", action=argparse.BooleanOptionalAction, default=None,
                   help="record inside static_dispatch(cached_weights=True) after prepare_static_weights on every "
                        "sparse layer (default: on with --forward-compile-mode reduce-overhead, which it needs; "
                        "session 47, H100, 1.5B at 4096 tokens: 0.950x -> 0.980x / 1.016x of recorded dense in two "
                        "runs)")
    g = p.add_argument_group("train")
    g.add_argument("--train-batch", type=int, default=8, help="sequences per training step")
    g.add_argument("--train-impl", choices=["hot-cold", "auto", "triton", "sparse-reference"], default=None,
                   help="train_impl of the sparse variant (default: hot-cold on CUDA, else sparse-reference)")
    g.add_argument("--train-lr", type=float, default=0.0,
                   help="AdamW learning rate of the timed steps; 0 (default) runs the same optimizer kernels "
                        "but keeps the calibrated sparsity, which any update destroys (see model_train)")
    g.add_argument("--train-check-seqs", type=int, default=None,
                   help="sequences of the float32 gradient check (0: skip; default: enough for 256 tokens, at most "
                        "--train-batch: on fewer, one unit switched on or off at one token can dominate the error)")
    g.add_argument("--train-warmup", type=int, default=2)
    g.add_argument("--train-reps", type=int, default=5)
    g.add_argument("--train-compile", action="store_true",
                   help="run each variant's training forward under torch.compile (both variants alike)")
    g.add_argument("--train-profile", action="store_true",
                   help="profile one more step per variant (CUDA): its largest kernels, kernel vs wall time")
    g = p.add_argument_group("decode")
    g.add_argument("--decode-batches", type=_csv(int), default=(1, 8, 64))
    g.add_argument("--prompt-len", type=int, default=128)
    g.add_argument("--new-tokens", type=int, default=128)
    g.add_argument("--decode-reps", type=int, default=3)
    g.add_argument("--decode-static-cache", action="store_true",
                   help="generate with transformers' static KV cache (on CUDA it also compiles the decode "
                        "step, CUDA graphs included): where the per-token host overhead no longer hides the FFN")
    g.add_argument("--decode-loop", choices=["generate", "graphed"], default="generate",
                   help="generate: transformers' generate; graphed: twell.generation.GreedyDecoder (static "
                        "cache, the one-token step replayed from a CUDA graph on CUDA), every variant alike")
    g.add_argument("--decode-compile", action="store_true",
                   help="with --decode-loop graphed: the step under torch.compile before it is recorded")
    g.add_argument("--decode-policies", type=_csv(str), default=("default", "decode", "always-sparse"),
                   help=f"dispatch policies of the sparse variants ({', '.join(POLICIES)}; 'decode' = the default "
                        "table plus the small-batch kernels for 1 to 64 tokens per call)")
    g = p.add_argument_group("output and execution")
    g.add_argument("--out", type=Path, default=Path("bench-results"))
    g.add_argument("--stem", default=None, help="file name stem (default model_<preset>)")
    g.add_argument("--isolation", choices=["auto", "process", "none"], default="auto",
                   help="process: each part in a child process; none: all in this one; auto: process on CUDA")
    g.add_argument("--part-timeout", type=float, default=180.0, help="seconds before a part's process is killed")
    g.add_argument("--child-part", choices=PARTS, default=None, help=argparse.SUPPRESS)
    g.add_argument("--child-json", type=Path, default=None, help=argparse.SUPPRESS)
    return p


def _check_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    bad = [x for x in a.parts if x not in PARTS]
    if bad or not a.parts:
        p.error(f"--parts takes {', '.join(PARTS)}; got {', '.join(bad)}")
    for flag, names in (("--forward-policies", a.forward_policies), ("--decode-policies", a.decode_policies)):
        for name in names:
            try:
                set_policy(name)
            except ValueError as exc:
                p.error(f"{flag}: {exc}")
    if "train" in a.parts and a.train_batch > a.batch:
        p.error(f"--train-batch {a.train_batch} > --batch {a.batch}: training uses sequences of the benchmark batch")
    for flag in ("batch", "seq", "train_batch", "prompt_len", "reps", "train_reps", "decode_reps"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    if a.new_tokens < 1 or any(b < 1 for b in a.decode_batches):
        p.error("--new-tokens and --decode-batches must be >= 1")
    if a.forward_compile_mode != "default" and not a.forward_compile:
        p.error(f"--forward-compile-mode {a.forward_compile_mode} sets the mode of --forward-compile; add "
                "--forward-compile")
    if a.forward_cached_weights is None:
        a.forward_cached_weights = a.forward_compile_mode == "reduce-overhead"
    if a.forward_cached_weights and a.forward_compile_mode != "reduce-overhead":
        p.error("--forward-cached-weights applies to recorded calls; add --forward-compile --forward-compile-mode "
                "reduce-overhead")
    if a.decode_compile and a.decode_loop != "graphed":
        p.error("--decode-compile compiles the step of --decode-loop graphed; add --decode-loop graphed")


class _Log:
    def __init__(self, prefix: str = "") -> None:
        self.t0 = time.perf_counter()
        self.prefix = prefix

    def __call__(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:7.1f}s] {self.prefix}{msg}", flush=True)


# ---------------------------------------------------------------------------------------------- one part
def _policies(part: str, a: argparse.Namespace) -> tuple[str, ...]:
    """The sparse MLP sets a part needs (train uses the model's own, default-policy set)."""
    wanted = {"forward": a.forward_policies, "decode": a.decode_policies, "train": ()}[part]
    return tuple(dict.fromkeys(("default", *wanted)))


def _prepare(a: argparse.Namespace, policies: tuple[str, ...], device: torch.device, log: _Log) -> BenchModel:
    target = SparsityTarget(mean_l0=a.l0 if a.l0 is not None else DEFAULT_L0[a.preset],
                            dead_fraction=a.dead_fraction, tail_exponent=a.tail_exponent, peak_ratio=a.peak_ratio)
    log(f"building {a.preset} ({a.dtype}) on {device} and calibrating on {a.batch} x {a.seq} tokens")
    bench = prepare(a.preset, device=device, dtype=getattr(torch, a.dtype), batch=a.batch, seq=a.seq,
                    target=target, policies=policies, seed=a.seed, backend=a.backend,
                    max_positions=max(a.seq, a.prompt_len + a.new_tokens), fused_norms=a.fused_norms,
                    fused_rope=a.fused_rope, fused_qkv=a.fused_qkv, fused_residual=a.fused_residual)
    log(f"built in {bench.seconds['build_s']:.1f} s, calibrated in {bench.seconds['calibrate_s']:.1f} s")
    return bench


def _setup_info(bench: BenchModel) -> dict[str, Any]:
    n_params = sum(p.numel() for p in {id(p): p for p in bench.model.parameters()}.values())
    return {"preset": bench.preset, "shape": vars(bench.spec), "parameters": n_params, "dtype": str(bench.dtype),
            "device": str(bench.device), **bench.seconds, "target": bench.target.to_dict(),
            "fused_norms": any(isinstance(m, FusedRMSNorm) for m in bench.model.modules()),
            "fused_rope": rotary_fused(),
            "fused_qkv": qkv_fused(bench.model),
            "fused_residual": residual_adds_fused(bench.model),
            "calibration": bench.calibration}


def _run_part(part: str, bench: BenchModel, a: argparse.Namespace, log: _Log,
              update: Any) -> dict[str, Any]:
    if part == "forward":
        cfg = ForwardConfig(warmup=a.warmup, reps=a.reps, energy_seconds=a.energy_seconds,
                            check_seqs=a.check_seqs, policies=a.forward_policies, profile=a.forward_profile,
                            compile=a.forward_compile, compile_mode=a.forward_compile_mode,
                            cached_weights=a.forward_cached_weights)
        return run_forward(bench, cfg, log, update)
    if part == "decode":
        cfg = DecodeConfig(batches=a.decode_batches, prompt_len=a.prompt_len, new_tokens=a.new_tokens,
                           reps=a.decode_reps, policies=a.decode_policies, static_cache=a.decode_static_cache,
                           loop=a.decode_loop, compile=a.decode_compile)
        return run_decode(bench, cfg, log, update)
    impl = a.train_impl or ("hot-cold" if bench.device.type == "cuda" else "sparse-reference")
    cfg = TrainConfig(batch=a.train_batch, check_seqs=a.train_check_seqs, impl=impl, lr=a.train_lr,
                      warmup=a.train_warmup, reps=a.train_reps, profile=a.train_profile, compile=a.train_compile)
    return run_train(bench, cfg, log, update)


def _part_in_process(part: str, a: argparse.Namespace, device: torch.device, log: _Log,
                     cache: dict[str, BenchModel], on_update: Any) -> dict[str, Any]:
    """``{"status", "setup", "result", "error"}`` of one part run here; the model is built once for all parts."""
    record: dict[str, Any] = {"status": "running"}
    try:
        if "bench" not in cache:
            policies = tuple(dict.fromkeys(p for x in PARTS for p in _policies(x, a)))
            cache["bench"] = _prepare(a, policies, device, log)
        record["setup"] = _setup_info(cache["bench"])

        def update(result: dict[str, Any]) -> None:
            record["result"] = result
            on_update(record)

        record["result"] = _run_part(part, cache["bench"], a, log, update)
        record["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - the part is recorded as failed, the others go on
        record["status"] = "error"
        record["error"] = describe_error(exc)
        log(f"{part}: FAILED: {record['error'].splitlines()[0]}")
    on_update(record)
    return record


def _child_main(a: argparse.Namespace, device: torch.device) -> int:
    part, path = a.child_part, a.child_json
    log = _Log(f"{part}: ")
    cache: dict[str, BenchModel] = {}
    a.parts = (part,)
    record = _part_in_process(part, a, device, log, cache, lambda r: write_json_atomic(path, r))
    return 0 if record["status"] == "ok" else 1


def _part_in_child(part: str, argv: list[str], a: argparse.Namespace, parts_dir: Path, log: _Log) -> dict[str, Any]:
    """Run one part in a child process (see the module docs) and read what it wrote, whatever its fate."""
    path = parts_dir / f"{part}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "twell.cli", "bench", "model", *argv, "--child-part", part, "--child-json", str(path)]
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the directory holding the twell package
    env["PYTHONPATH"] = os.pathsep.join(x for x in (package_root, env.get("PYTHONPATH", "")) if x)
    tail: deque[str] = deque(maxlen=40)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)

    def pump() -> None:  # echo the child's stderr and keep its end for the record
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc: int | None = proc.wait(timeout=a.part_timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = None
    reader.join(timeout=10)
    try:
        record = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError) as exc:
        record = {"read_error": str(exc)}
    if rc is None:
        record["status"] = "timeout"
        record["error"] = f"killed after --part-timeout {a.part_timeout:.0f} s\n" + "".join(tail)[-3000:]
    elif rc != 0 and record.get("status") in (None, "running", "ok"):
        record["status"] = "crashed"
        record["error"] = f"child exited with code {rc}\n" + "".join(tail)[-3000:]
    if record.get("status") != "ok":
        log(f"{part}: {record.get('status')}: {str(record.get('error', '')).splitlines()[0:1]}")
    return record


# ---------------------------------------------------------------------------------------------- output
def _write(parts: dict[str, dict[str, Any]], meta: dict[str, Any], out: Path, stem: str) -> list[Path]:
    setups = [r["setup"] for r in parts.values() if r.get("setup")]
    meta = {**meta, "setup": setups[0] if setups else None, "parts": parts}
    return write_results(part_rows(parts), meta, out, stem)


def _failed(parts: dict[str, dict[str, Any]]) -> bool:
    rows = part_rows(parts)
    return any(r.get("error") for r in rows) or any(r.get("ok") is False for r in rows)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    a = parser.parse_args(argv)
    _check_args(parser, a)
    hot_cold_plan.FUSED_GATE = a.fused_gate  # the parent and every part's child process (same argv)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.child_part is not None:
        return _child_main(a, device)
    stem = a.stem or f"model_{a.preset}"
    log = _Log()
    in_process = a.isolation == "none" or (a.isolation == "auto" and device.type != "cuda")
    meta: dict[str, Any] = {
        "environment": environment(device),
        "arguments": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()
                      if not k.startswith("child")},
        "sparsity_method": METHOD,
        "isolation": "in-process" if in_process else "one child process per part",
    }
    parts_dir = a.out / f"{stem}_parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    parts: dict[str, dict[str, Any]] = {}
    cache: dict[str, BenchModel] = {}
    t0 = time.perf_counter()
    for part in (p for p in PARTS if p in a.parts):
        log(f"=== {part} ===")
        if in_process:
            def keep(record: dict[str, Any], part: str = part) -> None:
                parts[part] = record
                _write(parts, meta, a.out, stem)

            parts[part] = _part_in_process(part, a, device, log, cache, keep)
        else:
            parts[part] = _part_in_child(part, argv, a, parts_dir, log)
        meta["wall_s"] = time.perf_counter() - t0
        paths = _write(parts, meta, a.out, stem)
    plot = plot_layers(parts, a.out / f"{stem}_layers.png")
    if plot is not None:
        paths.append(plot)
    print("\n" + summary_table(parts, a.preset, meta["environment"].get("device", str(device))))
    print(f"total {time.perf_counter() - t0:.0f} s; wrote " + ", ".join(str(p) for p in paths))
    return 1 if _failed(parts) else 0


if __name__ == "__main__":
    raise SystemExit(main())
