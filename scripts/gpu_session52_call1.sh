#!/usr/bin/env bash
# Session 52, GPU call 1: the whole 2048 x 5632 sweep at the session's start commit, the first since session 30's
# (51ac348; the README's table).  Twenty-one sessions of changes lie between them (the dense-row pass below 16,384
# tokens, cached weights, the decode and eager paths), so this checks the layer's figures as the library ships them.
# Predictions: bench_results/<gpu>/session52_runs.md, written before the call.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session52 1
nvidia-smi --query-gpu=name --format=csv,noheader
stage ffn_sweep "$(left 585)" "^\| 2048" python3 -m twell.cli bench ffn --shape 2048x5632 \
  --ms 1 16 256 1024 2048 4096 16384 131072 --out "$R" --stem ffn_sweep_session52
call_end
