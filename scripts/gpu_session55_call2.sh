#!/usr/bin/env bash
# Session 55, GPU call 2: the compiled training step with the hot set chosen eagerly inside it (9395f5f; call 1 found
# 0.068x of compiled dense with the set of an earlier eager call), and the compiled forward at 8192 tokens with the
# causal-mask rules.  Predictions: bench_results/<gpu>/session55_runs.md, written before the call.
#   TWELL_COMMIT=<sha> bash scripts/gpu_session55_call2.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session55 2
nvidia-smi --query-gpu=name --format=csv,noheader
stage pytest_compile "$(left 150)" "passed|failed|FAILED|Error" python3 -m pytest -q -p no:cacheprovider \
  -m "gpu or not gpu" tests/test_nn_compile.py tests/test_nn_mlp_hot_cold.py tests/test_models_compile.py
stage model_train_compiled "$(left 420)" "^\| train|^total|Error|error" python3 -m twell.cli bench model \
  --preset 1.5b --parts train --train-compile --part-timeout 260 --out "$R" --stem "model_train_compiled_fixed_${S}"
train_summary "$R/model_train_compiled_fixed_${S}.json"
stage model_forward_b4 "$(left 585)" "^\| forward|^total|Error" python3 -m twell.cli bench model --preset 1.5b \
  --parts forward --batch 4 --fused-norms --fused-residual --forward-policies default,tables --forward-compile \
  --out "$R" --stem "model_forward_b4_compiled_${S}"
forward_summary "$R/model_forward_b4_compiled_${S}.json"
call_end
