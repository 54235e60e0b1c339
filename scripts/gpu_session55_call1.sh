#!/usr/bin/env bash
# Session 55, GPU call 1: the 1.5B model's training step compiled (never measured before) and its compiled forward
# with the causal-mask rules (session 54's twell.models.causal_mask; the last compiled-forward figures, session 45,
# had transformers' materialised mask).  Predictions: bench_results/<gpu>/session55_runs.md, written before the call.
#   1. the eager training step as session 24 ran it (fused norms, rotary, residual adds), dense and sparse;
#   2. the training step under torch.compile (inductor), dense and sparse, without the fusions (inductor fuses);
#   3. the forward at 4096 tokens compiled in inductor's default mode, session 45 call 4's command.
#   TWELL_COMMIT=<sha> bash scripts/gpu_session55_call1.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session55 1
nvidia-smi --query-gpu=name --format=csv,noheader
stage model_train_eager "$(left 100)" "^\| train|^total|Error" python3 -m twell.cli bench model --preset 1.5b \
  --parts train --fused-norms --fused-rope --fused-residual --out "$R" --stem "model_train_eager_${S}"
stage model_train_compiled "$(left 400)" "^\| train|^total|Error|error" python3 -m twell.cli bench model \
  --preset 1.5b --parts train --train-compile --part-timeout 290 --out "$R" --stem "model_train_compiled_${S}"
stage model_forward_b2 "$(left 580)" "^\| forward|^total|Error" python3 -m twell.cli bench model --preset 1.5b \
  --parts forward --batch 2 --fused-norms --fused-residual --forward-policies default --forward-compile \
  --out "$R" --stem "model_forward_b2_compiled_${S}"
forward_summary "$R/model_forward_b2_compiled_${S}.json"
call_end
