#!/usr/bin/env bash
# Session 45, after call 3 (bench_results/h100/session45_runs.md): the 1.5B backbone compiled in inductor's default
# mode at 4096 tokens read 0.794x of compiled dense with the default policy (the traced calls followed the tables; the
# compiled graph still issues every launch from the host).  Since this commit a call traced outside static_dispatch
# counts as eager for the policy's floor.  Predicted: the default's compiled forward at 4096 tokens ~0.98-1.02x (dense
# layers, as its eager forward), and the GPU tests of the recording / reduce-overhead recipes (now traced inside
# static_dispatch), the eager-floor tests and the graphed decode steps pass.
#   TWELL_SESSION=session45 TWELL_COMMIT=<sha> bash scripts/gpu_session45_call4.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session45}" 4
nvidia-smi --query-gpu=name --format=csv,noheader
stage pytest_gpu_recipes "$(left 200)" "passed|failed|FAILED|Error" python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_nn_mlp_hot_cold.py tests/test_dispatch_eager_floor.py tests/test_generation.py tests/test_nn_decode.py
stage model_forward_b2 "$(left 420)" "^\| forward|^total|Error" python3 -m twell.cli bench model --preset 1.5b \
  --parts forward --batch 2 --fused-norms --fused-residual --forward-policies default --forward-compile \
  --out "$R" --stem "model_forward_b2_after_${S}"
forward_summary "$R/model_forward_b2_after_${S}.json"
call_end
