#!/usr/bin/env bash
# Session 48, second call: the small-call hot-set bound (hot_cold_plan.HOT_MAX_COLD_L0_SMALL, 3) against 10, now that
# the dense-row pass runs as its Triton kernels (FUSED_PASS on since call 1).  Call 1 (H100) had the recorded 1.5B
# forward at 4096 tokens 26.10 ms with bound 10 against 26.52 with 3 (one run each; dense 26.87 / 26.85), and
# session 46 on an H200 26.94 against 27.92, while session 28's synthetic tuning on the H200 (2048x5632) chose 3: at
# 4096 tokens 0.237 / 0.273 ms against 0.254 / 0.294 at 0.25 / 0.5 %.  So first both bounds twice more on the model,
# alternated, at 4096 tokens and once at 2048, then the synthetic points at 2048 and 4096 tokens and 0.25-2 % on this
# card with each bound, then the bench's recorded backbone (the README's recipe) with the fused pass.
# Predicted: the model ~0.3-0.5 ms faster with 10 at 4096 tokens in both pairs; the synthetic points as in session 28
# (3 ahead by ~5-10 % at 4096 tokens and 0.5-2 %).  A change needs both to agree.
#   TWELL_COMMIT=<sha> bash scripts/gpu_session48_call2.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session48 bound
nvidia-smi --query-gpu=name --format=csv,noheader
budget=130
for rep in a b; do
  for b in 10 3; do
    stage "probe_bound${b}_4096_$rep" "$(left "$budget")" "^tokens=.*(gpu)|^ {4} *[0-9].*(twell|hot_cold_gate)|Error" \
      python3 scripts/recorded_forward_probe.py --policy tables --tokens 4096 --top 40 --samples 5 --cached-weights \
      --small-bound "$b" --out "$R/bound${b}_4096_$rep"
    budget=$((budget + 60))
  done
done
for b in 10 3; do
  stage "probe_bound${b}_2048" "$(left "$budget")" "^tokens=.*(gpu)|^ {4} *[0-9].*(twell|hot_cold_gate)|Error" \
    python3 scripts/recorded_forward_probe.py --policy tables --tokens 2048 --top 40 --samples 5 --cached-weights \
    --small-bound "$b" --out "$R/bound${b}_2048"
  budget=$((budget + 50))
done
for b in 3 10; do
  stage "tune_small_bound$b" "$(left "$budget")" "x  err|Error" python3 scripts/twell_patched.py \
    --set "twell.ops.hot_cold_plan.HOT_MAX_COLD_L0_SMALL=$b.0" -- tune-dispatch --shape 2048x5632 --ms 2048 4096 \
    --densities 0.25 0.5 1 2 --out "$R" --stem "dispatch_2048x5632_session48_small_bound$b"
  budget=$((budget + 50))
done
stage model_forward_recorded_b2 "$(left 590)" "^\| forward|^total|Error" \
  python3 -m twell.cli bench model --preset 1.5b --parts forward --batch 2 --fused-norms --fused-residual \
  --forward-policies default --forward-compile --forward-compile-mode reduce-overhead --out "$R" \
  --stem "model_forward_recorded_b2_${S}"
forward_summary "$R/model_forward_recorded_b2_${S}.json"
call_end
