#!/usr/bin/env bash
# Session 28, GPU call 1: scripts/fp8_screen_probe.py (does an fp8 screen GEMM pay: its accuracy per margin on the
# synthetic problem, cuBLAS's fp8 GEMM against the bf16 gate GEMM), then `twell tune-dispatch` at 2048-8192 tokens
# on the current op (docs/performance.md next step (a): the op alone beat dense where the table runs dense), then the
# 16384 / 2 % point of the FFN bench with the module's own hot count and dense rows recorded (next step (e)).
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session28 1
stage fp8_screen 150 "^M=" python3 scripts/fp8_screen_probe.py
stage tune_small_m "$(left 480)" "x  err|sparse when|dispatch for" python3 -m twell.cli tune-dispatch \
  --shape 2048x5632 --ms 2048 4096 8192 --out "$R" --stem dispatch_2048x5632_session28_small_m
stage ffn_2pct "$(left 585)" "^\| 2048|hot|dense rows" python3 -m twell.cli bench ffn --shape 2048x5632 \
  --ms 16384 --densities 2 --out "$R" --stem ffn_16384_2pct_session28
call_end
