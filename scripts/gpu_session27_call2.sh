#!/usr/bin/env bash
# Session 27, GPU call 2, with the list pass beside the fused gate and one waiting list program on by default
# (hot_cold.LIST_BESIDE_GATE, twell_list_kernel.LIST_ONE_WAITS): the whole GPU suite (358.88 s in session 26),
# then the 4096x14336 FFN at the paper's 0.5 % (the larger shape's beside path, last measured in session 16).
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session27 2
stage pytest_gpu_all 470 "FAILED|passed|failed|Error" python3 -m pytest -q -m gpu -p no:cacheprovider tests
stage ffn_4096x14336 "$(left 585)" "^\| 4096" python3 -m twell.cli bench ffn --shape 4096x14336 --ms 16384 \
  --densities 0.5 --out "$R" --stem ffn_4096x14336_session27
call_end
