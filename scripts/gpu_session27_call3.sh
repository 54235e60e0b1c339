#!/usr/bin/env bash
# Session 27, GPU call 3: the two GPU tests that call 2 failed (their spies missed the list pass that now runs
# beside the fused gate, mended), then the whole FFN sweep at 2048 x 5632 as session 22 ran it (405 s there), with
# the list pass beside the gate and one waiting list program on.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session27 3
stage pytest_gpu_fixed 120 "FAILED|passed|failed|Error" python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_ops_gather_heavy_first.py tests/test_ops_twell_list.py
stage ffn_sweep "$(left 585)" "^\| 2048" python3 -m twell.cli bench ffn --shape 2048x5632 \
  --ms 1 16 256 1024 2048 4096 16384 131072 --out "$R" --stem ffn_sweep_session27
call_end
