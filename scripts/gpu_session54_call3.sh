#!/usr/bin/env bash
# Session 54, GPU call 3: the traced forward's causal mask (twell.models.causal_mask) with both rules: the mask
# function's skip and the packed-sequence check of a backbone that built its own positions.  Call 2 found rule 1 alone
# changing nothing (the recorded forward runs without a cache, so transformers' packed-sequence check under tracing
# materialised the mask first).  Predictions: bench_results/<gpu>/session54_runs.md, written before the call.
#   1. the models' and generation's GPU tests and the causal-mask tests natively;
#   2. the recorded 1.5B forward at 2048 tokens with the rules off and on, each in its own process.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session54 3
nvidia-smi --query-gpu=name --format=csv,noheader
stage pytest_models "$(left 170)" "passed|failed|Error" python3 -m pytest -q -p no:cacheprovider \
  tests/test_models_causal_mask.py tests/test_models_gpu.py tests/test_generation.py -m "gpu or not gpu" -x
budget=170
for args in "skipoff --no-causal-skip" "skipon --causal-skip"; do
  read -r label skip <<< "$args"
  budget=$((budget + 110))
  stage "probe_${label}_2048" "$(left "$budget")" "^tokens=.*(gpu)|^ +[0-9.]+ us +28x (cudnn|triton_poi_fused__scaled)|Error" \
    python3 scripts/recorded_forward_probe.py --policy tables --top 12 --samples 5 --cached-weights --tokens 2048 \
    "$skip" --out "$R/${label}_2048"
done
call_end
