#!/usr/bin/env bash
# Session 57, GPU call 1: the recorded eager calls (SparseGatedMLP(eager_graphs=N), twell.nn.call_graphs), new in this
# session: calls below the default's eager floor (8937 tokens at 2048 x 5632) that the tables send to the hot/cold split
# are recorded in a CUDA graph per token count and replayed.
#   1. their GPU tests (real CUDA graphs: the split's bits on new inputs, residual, weight update, streams, shared
#      buffers), tests/test_nn_call_graphs.py;
#   2. scripts/eager_floor_probe.py, dense / default / tables / default with eager_graphs=4, 2048-16,384 tokens, the
#      1.5B model's eager forward by the wall clock; twice (the spread between runs at 8192 tokens, session 56);
#   3. twell bench model --forward-policies default,tables,default+graphs at 4096 tokens (added for call 5).
# Predictions: bench_results/<gpu>/session57_runs.md, written before the call.
#   TWELL_COMMIT=<sha> [CALL_NO=k] bash scripts/gpu_session57_call1.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session57 "${CALL_NO:-1}"
nvidia-smi --query-gpu=name --format=csv,noheader
stage gpu_tests_call_graphs "$(left 150)" "passed|failed|Error" python3 -m pytest -q -p no:cacheprovider \
  tests/test_nn_call_graphs.py -m "gpu or kernel" -rs
for run in a b; do
  stage "eager_floor_probe_$run" "$(left 460)" "tokens=|eager floor|Error|error" python3 scripts/eager_floor_probe.py \
    --policies default tables --graphs 4 --tokens 2048 4096 6144 8192 12288 16384 --reps 9 --out "$R"
  [ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/eager_floor_probe_${run}_call${CALL}_$S.json"
done
# 3. (from call 5 on) twell bench model's forward at 4096 tokens with the graphed variant beside the default and tables
stage model_forward_b2_graphs "$(left 400)" "^\| forward|^total|Error" python3 -m twell.cli bench model --preset 1.5b \
  --parts forward --batch 2 --fused-norms --fused-residual --forward-policies default,tables,default+graphs \
  --energy-seconds 0 --out "$R" --stem "model_forward_b2_graphs_call${CALL}_${S}"
forward_summary "$R/model_forward_b2_graphs_call${CALL}_${S}.json"
call_end
