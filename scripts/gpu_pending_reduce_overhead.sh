#!/usr/bin/env bash
# Pending since session 45 (bench_results/h100/session45_runs.md, docs/performance.md "Next steps"): the 1.5B
# backbone under torch.compile(mode="reduce-overhead") traced and called inside static_dispatch, the README's recipe for
# recorded calls below the eager floor, at 4096 and 8192 tokens (`--forward-compile-mode reduce-overhead`, new in
# session 45).  The decoder layers' GPU time on the H100 machine: 21.48 vs 22.41 ms (4096) and 35.49 vs 42.46 (8192)
# sparse against dense.  Predicted: the recorded default ~1.02-1.06x of recorded dense at 4096 tokens and ~1.12-1.22x at
# 8192 (the attention and the rest unchanged, no host time); the plain compiled default ~1.0x at both (dense below its
# floor since e9dde60).  First the per-layer FFN spans at 8192 tokens with the GPU held (forward_layer_times --hold-ms,
# since 399348e): predicted GPU time ~0.5-0.7 ms a sparse layer from layer 3 on (dense 0.84), layers 0-2 higher (their
# overflowing cold tiles), all layers ~1.2-1.3x.  Then the model's graphed decode on this machine.
#   TWELL_SESSION=session46 TWELL_COMMIT=<sha> bash scripts/gpu_pending_reduce_overhead.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session46}" recorded
nvidia-smi --query-gpu=name --format=csv,noheader
stage forward_layer_times_b4 "$(left 80)" "^layer|^all layers|Error" \
  python3 scripts/forward_layer_times.py --batch 4 --seq 2048 --reps 5
for b in 2 4; do
  stage "model_forward_recorded_b$b" "$(left $((b == 2 ? 230 : 420)))" "^\| forward|^total|Error" python3 -m twell.cli \
    bench model --preset 1.5b --parts forward --batch "$b" --fused-norms --fused-residual --forward-policies default \
    --forward-compile --forward-compile-mode reduce-overhead --out "$R" --stem "model_forward_recorded_b${b}_${S}"
  forward_summary "$R/model_forward_recorded_b${b}_${S}.json"
done
stage model_decode "$(left 580)" "^\| decode|^total" python3 -m twell.cli bench model --preset 1.5b --parts decode \
  --fused-norms --fused-residual --decode-loop graphed --decode-compile --decode-policies default \
  --decode-batches 2,8 --part-timeout 240 --out "$R" --stem "model_decode_${S}"
call_end
