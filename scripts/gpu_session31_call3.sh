#!/usr/bin/env bash
# Session 31, GPU call 3.  Call 2's second run of 896 x 4864 marked its one-token 0.25 % point WRONG (6.0e-3 against
# the 5e-3 bar).  On the CPU the dense bf16 module misses 5e-3 on ~5 % of single tokens at that shape and density, and
# the sparse path's error equals the dense module's token by token; tune-dispatch now records the dense module's error
# and passes a point within 1.1x of it (tolerances.within_tolerance).  Predicted: the same draw (seed 1) reads 6.0e-3
# again with a dense error of ~6.0e-3, and passes.  Then the whole GPU suite at this commit.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session31 3
stage tune_896x4864_b2 "$(left 150)" "sparse when|never won|: dense|WRONG|M=      1 density  0.25" python3 -m twell.cli \
  tune-dispatch --shape 896x4864 --ms 1 16 64 256 512 1024 2048 4096 8192 16384 32768 131072 \
  --densities 0.25 0.5 1 2 5 10 --seed 1 --out "$R" --stem dispatch_896x4864_session31_b2
stage pytest_gpu_all "$(left 585)" "FAILED|passed|failed" python3 -m pytest -q -m gpu -p no:cacheprovider tests
call_end
