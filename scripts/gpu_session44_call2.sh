#!/usr/bin/env bash
# Session 44, with little device time left: where the 1.5B model's eager forward at 8192 tokens loses on the H200
# machine (0.78x of dense, while one layer at 8192 tokens won 1.08x; bench_results/h200/session44_runs.md).
# Hypothesis: GPU time, not host time: the model's calibrated sparsity has overflowing cold tiles in the first
# positions of each sequence in the first layers (session 22: layer 0 took 10.5 ms sparse against 6.0-6.5 at 131,072
# tokens), whose row-kernel programs form a tail that a smaller call cannot hide.  Predicted if so: per-layer sparse
# FFN spans at 8192 tokens well above the synthetic layer's 0.455 ms in the first layers (>= 1 ms), near it in the
# others; at 16,384 tokens (batch 8, where the forward won 1.31x) the same layers' excess hidden behind more work.
# Then the stall probe (synchronising calls, allocator traffic) at 4096 and 8192 tokens if time is left.
#   TWELL_SESSION=session44 TWELL_COMMIT=<sha> bash scripts/gpu_session44_call2.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session44}" layers
stage forward_layer_times_b4 "$(left 100)" "^layer|^all layers|Error" \
  python3 scripts/forward_layer_times.py --batch 4 --seq 2048 --reps 5
stage forward_layer_times_b8 "$(left 200)" "^all layers|Error" \
  python3 scripts/forward_layer_times.py --batch 8 --seq 2048 --reps 5
stage eager_stall_probe "$(left 300)" "tokens=|stalls|Error|error" \
  python3 scripts/eager_stall_probe.py --tokens 4096 8192 --reps 5 --out "$R"
call_end
