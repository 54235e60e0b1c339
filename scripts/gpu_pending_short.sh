#!/usr/bin/env bash
# Session 42, for a call with less device time than the whole suite needs (most of the session's budget went to
# requests that found no machine): first the GPU tests that have never run (a layer's call recorded in a CUDA graph
# inside static_dispatch, the layer under torch.compile(mode="reduce-overhead"), the batch decode kernels' 33-64 token
# launch, with their files' other GPU tests), then the eager-forward floor probe (scripts/gpu_pending_eager_forward.sh's
# stage, its prediction there), then as much of the rest of the GPU suite as the budget leaves (a partial log still
# says which tests ran).  BUDGET: the call's limit in seconds, less a margin (default 540).
#   BUDGET=480 TWELL_SESSION=session42 TWELL_COMMIT=<sha> bash scripts/gpu_pending_short.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session42}" short
B=${BUDGET:-540}
NEW=(tests/test_nn_mlp_hot_cold.py tests/test_ops_decode_batch.py)
nvidia-smi --query-gpu=name --format=csv,noheader
stage pytest_gpu_new "$(left "$B")" "passed|failed|FAILED|Error" \
  python3 -m pytest "${NEW[@]}" -q -m gpu -p no:cacheprovider
stage eager_floor_probe "$(left "$B")" "tokens=|eager floor|Error|error" \
  python3 scripts/eager_floor_probe.py --policies default always-sparse --out "$R"
[ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/eager_floor_probe_call${CALL}_$S.json"
stage pytest_gpu_rest "$(left "$B")" "passed|failed|FAILED|Error" \
  python3 -m pytest tests -q -m gpu -p no:cacheprovider "${NEW[@]/#/--ignore=}"
call_end
