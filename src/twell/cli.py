"""The ``twell`` command."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="twell", description="Sparse-activation FFNs on GPUs (TwELL format).")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks (twell bench ffn --help)")
    bench.add_argument("which", choices=["ffn"])
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    sub.add_parser("info", help="versions, device and backends")
    args = parser.parse_args(argv)
    if args.command == "bench":
        from .bench import ffn

        return ffn.main(args.rest)
    if args.command == "info":
        import torch

        from .bench.environment import environment
        from .ops._runtime import triton_available

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        for k, v in environment(device).items():
            print(f"{k}: {v}")
        print(f"triton kernels: {'available' if triton_available() else 'unavailable'}")
        return 0
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
