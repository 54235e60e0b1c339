"""The ``twell`` command: ``bench``, ``info``, ``demo``, ``train``, ``generate``, ``tune-dispatch`` and
``tune-decode``."""

from __future__ import annotations

import argparse
import sys

#: ``twell.nn.mlp.TRAIN_IMPLS``, spelled out so that building the parser does not import torch
#: (tests/test_train_cli.py checks that the two agree).
TRAIN_FFN_CHOICES = ["auto", "dense", "sparse-reference", "triton", "hot-cold"]


def _add_train_args(p: argparse.ArgumentParser) -> None:
    """``twell train`` options, one per :class:`twell.train.trainer.TrainConfig` field (defaults from it)."""
    from .train.model import PRESETS
    from .train.trainer import PRECISIONS, TrainConfig

    d = TrainConfig()
    p.add_argument("--preset", default=d.preset, choices=list(PRESETS), help="model size (default %(default)s)")
    p.add_argument("--arch", default=d.arch, choices=["auto", "hf", "builtin"],
                   help="twell.models HF classes, the built-in TinyLlama, or auto (hf when importable)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per process and step")
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: per preset)")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--warmup-steps", type=int, default=None, help="lr warm-up (default: 10%% of steps, <= 2000)")
    p.add_argument("--l1-coef", type=float, default=d.l1_coef, help="L1 coefficient (published: %(default)s)")
    p.add_argument("--l1-warmup-steps", type=int, default=d.l1_warmup_steps)
    p.add_argument("--no-revive", action="store_true", help="turn dead-unit revival off")
    p.add_argument("--dead-window-tokens", type=int, default=d.dead_window_tokens)
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--eval-batches", type=int, default=d.eval_batches)
    p.add_argument("--out", default=None, help="directory for train_log.json and sparsity plots")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--resume", default=None, help="checkpoint dir (or step dir) to continue from")
    p.add_argument("--data", nargs="*", default=None,
                   help="text files/folders (default: the Python standard library's source)")
    p.add_argument("--vocab-size", type=int, default=d.vocab_size)
    p.add_argument("--max-bytes", type=int, default=d.max_bytes, help="corpus cap in bytes (0: no cap)")
    p.add_argument("--cache-dir", default=None, help="tokenizer/token cache (default ~/.cache/twell/data)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--device", default=d.device)
    p.add_argument("--precision", default=d.precision, choices=list(PRECISIONS),
                   help="auto: bf16 weights on CUDA, fp32 on CPU; autocast: fp32 weights + bf16 autocast")
    p.add_argument("--fused-adamw", action="store_true", help="PyTorch's fused AdamW kernel (CUDA)")
    p.add_argument("--train-ffn", default=d.train_ffn, choices=TRAIN_FFN_CHOICES,
                   help="training FFN of every SparseGatedMLP (its train_impl; auto = dense autograd for now; "
                   "hot-cold = the sparse hot/cold Triton op)")
    p.add_argument("--compile", action="store_true",
                   help="training forward through torch.compile (inductor on CUDA; aot_eager on the CPU)")
    p.add_argument("--no-progress", action="store_true")


def _run_train(args: argparse.Namespace) -> int:
    import os

    from .train.stats import collect_sparsity, plot_history, save_sparsity
    from .train.trainer import TrainConfig, train

    cfg = TrainConfig(
        preset=args.preset, arch=args.arch, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
        lr=args.lr, weight_decay=args.weight_decay, warmup_steps=args.warmup_steps, l1_coef=args.l1_coef,
        l1_warmup_steps=args.l1_warmup_steps, revive=not args.no_revive, dead_window_tokens=args.dead_window_tokens,
        eval_every=args.eval_every, eval_batches=args.eval_batches, out_dir=args.out,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every, resume_from=args.resume,
        data_paths=args.data, vocab_size=args.vocab_size, max_bytes=args.max_bytes or None,
        data_cache_dir=args.cache_dir, seed=args.seed, device=args.device, precision=args.precision,
        fused_adamw=args.fused_adamw, compile=args.compile,
        train_ffn=args.train_ffn, progress=not args.no_progress,
    )
    result = train(cfg)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    last = result.logs[-1] if result.logs else {}
    print(f"{result.n_params / 1e6:.2f} M params, {result.tokens / 1e6:.2f} M tokens in {result.seconds:.0f} s; "
          f"final lm loss {last.get('lm_loss', float('nan')):.3f}, held-out {result.final_eval_loss}, "
          f"l0 {last.get('l0', float('nan')):.1f}, dead fraction {last.get('dead_fraction')}")
    if args.out:
        from .train.data import prepare_data

        data = prepare_data(cfg.data_paths, seq_len=cfg.seq_len, vocab_size=cfg.vocab_size, max_bytes=cfg.max_bytes,
                            cache_dir=cfg.data_cache_dir)
        device = next(result.model.parameters()).device
        batches = [data.heldout[i:i + cfg.batch_size, :-1].to(device)
                   for i in range(0, min(len(data.heldout), 4 * cfg.batch_size), cfg.batch_size)]
        report, _ = collect_sparsity(result.model, batches)
        save_sparsity(report, args.out)
        plot_history({"train": result.logs}, f"{args.out}/training.png")
        print(f"wrote train_log.json, sparsity.json and plots to {args.out}")
    return 0


#: ``twell bench NAME`` -> module of twell.bench whose ``main(argv)`` runs it.
_BENCHES = {"ffn": "ffn", "train-ffn": "train_ffn", "model": "model"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["generate"]:  # its own parser (argparse's REMAINDER would not pass a leading --help on)
        from .generate_cli import main as generate_main

        return generate_main(argv[1:])
    if argv[:1] == ["tune-dispatch"]:  # likewise
        from .bench.tune_dispatch import main as tune_main

        return tune_main(argv[1:])
    if argv[:1] == ["tune-decode"]:  # likewise
        from .bench.tune_decode import main as tune_decode_main

        return tune_decode_main(argv[1:])
    parser = argparse.ArgumentParser(prog="twell", description="Sparse-activation FFNs on GPUs (TwELL format).")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks: ffn, train-ffn, model (twell bench ffn --help)")
    bench.add_argument("which", choices=sorted(_BENCHES))
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    sub.add_parser("info", help="versions, device and backends")
    demo = sub.add_parser("demo", help="train a tiny model with and without L1 on the stdlib source (CPU, no download)")
    demo.add_argument("--steps", type=int, default=None, help="steps per run (default 600; --quick: 150)")
    demo.add_argument("--out", default="twell-demo", help="output directory (default %(default)s)")
    demo.add_argument("--quick", action="store_true", help="a ~1 minute version (smaller model and data)")
    demo.add_argument("--l1-coef", type=float, default=None, help="L1 coefficient of the sparse run")
    demo.add_argument("--cache-dir", default=None, help="tokenizer/token cache (default ~/.cache/twell/data)")
    demo.add_argument("--no-progress", action="store_true")
    train_p = sub.add_parser("train", help="train a ReLU-gated model with the L1 recipe (torchrun for DDP)")
    _add_train_args(train_p)
    # listed for --help; main() hands "twell generate ..." / "twell tune-dispatch / tune-decode ..." on before parsing
    sub.add_parser("generate", help="greedy generation from a local model directory (twell generate --help)")
    sub.add_parser("tune-dispatch", help="measure where the sparse layer beats dense on this GPU for a layer shape "
                   "and write a dispatch policy file (twell tune-dispatch --help)")
    sub.add_parser("tune-decode", help="measure where the small-batch kernels beat dense inside a CUDA graph for a "
                   "layer shape and write a policy file with its decode table (twell tune-decode --help)")
    args = parser.parse_args(argv)
    if args.command == "bench":
        import importlib

        return importlib.import_module(f".bench.{_BENCHES[args.which]}", __package__).main(args.rest)
    if args.command == "info":
        import torch

        from .bench.environment import environment
        from .ops._runtime import triton_available

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        for k, v in environment(device).items():
            print(f"{k}: {v}")
        print(f"triton kernels: {'available' if triton_available() else 'unavailable'}")
        from .nn import DEFAULT_POLICY
        from .nn.dispatch_summary import inference_summary, training_summary
        from .nn.train_dispatch import DEFAULT_TRAIN_POLICY
        from .ops._runtime import cuda_capability

        capability = cuda_capability(device)
        print(f"inference dispatch (DEFAULT_POLICY): {inference_summary(DEFAULT_POLICY, device.type, capability)}")
        print(f"training dispatch (DEFAULT_TRAIN_POLICY): "
              f"{training_summary(DEFAULT_TRAIN_POLICY, device.type, capability)}")
        return 0
    if args.command == "demo":
        from .train.demo import DEMO_L1_COEF, run_demo

        run_demo(steps=args.steps, out=args.out, quick=args.quick,
                 l1_coef=DEMO_L1_COEF if args.l1_coef is None else args.l1_coef, cache_dir=args.cache_dir,
                 progress=not args.no_progress)
        return 0
    if args.command == "train":
        return _run_train(args)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
