#!/usr/bin/env bash
# Session 56, GPU call 1: where the default policy's eager floor belongs now (session 55's next step 1).  The floor
# (DispatchPolicy.eager_min_flops, 6.18e11 FLOPs: 8937 tokens at 2048 x 5632) came from session 44's H200 runs, where
# the 1.5B model's eager forward on the tables lost at 8192 tokens (0.784x); on an H100 in session 55 the tables ran
# 1.158x eager and 1.203x compiled there while the default kept the layers dense (0.993x / 1.003x).
#   1. scripts/eager_floor_probe.py, default and tables, 2048-16,384 tokens by the wall clock;
#   2. twell tune-dispatch --eager at 2048 x 5632 (one layer's eager calls, the host's issuing counted);
#   3. the forward at 8192 tokens compiled (inductor, default mode), default and tables (session 55 call 2's command);
# Predictions: bench_results/<gpu>/session56_runs.md, written before the call.
#   TWELL_COMMIT=<sha> bash scripts/gpu_session56_call1.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session56 1
nvidia-smi --query-gpu=name --format=csv,noheader
stage eager_floor_probe "$(left 170)" "tokens=|eager floor|Error|error" python3 scripts/eager_floor_probe.py \
  --policies default tables --tokens 2048 4096 6144 8192 12288 16384 --reps 9 --out "$R"
[ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/eager_floor_probe_call${CALL}_$S.json"
stage tune_eager_2048x5632 "$(left 215)" "eager|Error|WRONG|wrote" python3 -m twell.cli tune-dispatch \
  --shape 2048x5632 --ms 2048 4096 8192 16384 --densities 0.5 2 --eager --out "$R" \
  --stem "dispatch_eager_2048x5632_call${CALL}_$S"
stage model_forward_b4 "$(left 420)" "^\| forward|^total|Error" python3 -m twell.cli bench model --preset 1.5b \
  --parts forward --batch 4 --fused-norms --fused-residual --forward-policies default,tables --forward-compile \
  --out "$R" --stem "model_forward_b4_compiled_${S}"
forward_summary "$R/model_forward_b4_compiled_${S}.json"
call_end
