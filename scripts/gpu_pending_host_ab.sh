#!/usr/bin/env bash
# Session 40: the hot/cold path's host time after a04fb03 (plain-Python cdiv in the launchers, one environment read per
# fused-gate launch, the module's eager hot/cold calls straight to the launcher) against 8e73124, whose src/ travels
# untracked as base_src/ for this call only.  First the GPU tests of the module and model paths that the change
# touches (the module's eager path, no synchronisation on non-refresh calls), then `op_host_time.py` alternating
# base / new in separate processes, then the host time of the pieces an op call is built from.
# Predicted (CPU with launches stubbed: the module's call 97.5 -> 55.2 us, the op's 60.4 -> 51.5): on the GPU machine's
# slower host the op -30 to -60 us a call of its ~450-950, the module -60 to -120 us.  ~4 minutes.
#   TWELL_SESSION=session40 TWELL_COMMIT=<sha> bash scripts/gpu_pending_host_ab.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session40}" hostab
stage pytest_gpu_module "$(left 200)" "passed|failed|FAILED|Error" \
  python3 -m pytest tests/test_nn_mlp.py tests/test_nn_mlp_hot_cold.py tests/test_nn_overhead.py tests/test_nn_residual.py \
  tests/test_nn_decode.py tests/test_models_gpu.py tests/test_ops_hot_cold_dense_rows.py -q -m gpu -p no:cacheprovider
for round in 1 2; do
  for v in base new; do
    src=src; [ "$v" = base ] && src=base_src
    stage "host_${v}_2048x5632_r$round" "$(left 420)" ": host|Error" env PYTHONPATH="$src:scripts" \
      python3 scripts/op_host_time.py --shape 2048x5632 --points 1024:28 16384:28
  done
done
for v in base new; do
  src=src; [ "$v" = base ] && src=base_src
  stage "host_${v}_1024x3072" "$(left 500)" ": host|Error" env PYTHONPATH="$src:scripts" \
    python3 scripts/op_host_time.py --shape 1024x3072 --points 16384:30
done
stage host_pieces "$(left 560)" "piece|Error" python3 scripts/op_host_time.py --shape 1024x3072 --points 1024:30 --pieces
call_end
