#!/usr/bin/env bash
# Session 27, GPU call 1: the hot/cold tail's GPU tests (now with the one-waiting-program cases and the carveout
# test, not yet run on a GPU), scripts/tail_probe.py (twell_list_kernel.LIST_ONE_WAITS against every list program
# waiting, beside the gate and after the hot down GEMM), then either the FFN headline with the winner's switches (if
# "beside@1-onewait" beats "now+pdl" by 0.5 % at 16384 tokens) or the whole GPU suite.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session27 1
stage pytest_gpu_tail 150 "FAILED|passed|failed|Error" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ops_hot_cold_tail.py
stage tail_probe "$(left 420)" "interleaved|bit for bit|_hot_cold_gate_kernel|_list_twell|back to back" python3 scripts/tail_probe.py
WIN=$(probe_beats "$R/tail_probe_call1_$S.log" 16384 beside@1-onewait now+pdl 0.995)
echo "beside@1-onewait beats now+pdl at 16384: $WIN"
if [ "$WIN" = 1 ]; then
  stage ffn_headline_beside_onewait "$(left 580)" "^\| 2048" python3 -c "
import sys
from twell.ops import hot_cold, twell_list_kernel
hot_cold.LIST_BESIDE_GATE = True
twell_list_kernel.LIST_ONE_WAITS = True
from twell.cli import main
sys.exit(main(sys.argv[1:]))" bench ffn --shape 2048x5632 --ms 16384 131072 --densities 0.5 1 --extra \
    --energy-seconds 1 --out "$R" --stem ffn_headline_beside_onewait_$S
else
  stage pytest_gpu_all "$(left 580)" "FAILED|passed|failed" python3 -m pytest -q -m gpu -p no:cacheprovider tests
fi
call_end
