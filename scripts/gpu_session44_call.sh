#!/usr/bin/env bash
# Session 44, after the whole suite and the decode re-tune on the H200 (bench_results/h200/session44_runs.md):
# 1. Why the 1.5B model's eager forward at 8192 tokens ran 0.77-0.78x of dense on the H200 machine (53.7-54.8 ms,
#    above both its host-bound 4096-token forward, 36.8 ms, and its GPU time, ~32 ms from the held FFN times) while one
#    eager layer at 8192 tokens won 1.08x: scripts/eager_stall_probe.py counts the host's synchronising runtime calls
#    and the allocator's cudaMalloc / cudaFree / retries per token count.  Predicted if a stall: synchronise or
#    cudaFree events in the sparse forward at 8192 tokens, none (or fewer) at 4096 and 16,384.
# 2. The 1.5B model's compiled, graphed decode at batch 2 and 8 with session 44's decode tables (session 39 with the
#    old tables: 1.090x / 1.075x).  Predicted: the same or up to ~2 % better (more layers on the small-batch kernels at
#    batch 8 where the tables widened).
#   TWELL_SESSION=session44 TWELL_COMMIT=<sha> bash scripts/gpu_session44_call.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session44}" stall
nvidia-smi --query-gpu=name --format=csv,noheader
stage eager_stall_probe "$(left 200)" "tokens=|stalls|Error|error" python3 scripts/eager_stall_probe.py --out "$R"
stage model_decode "$(left 560)" "^\| decode|^total" python3 -m twell.cli bench model --preset 1.5b --parts decode \
  --fused-norms --fused-residual --decode-loop graphed --decode-compile --decode-policies default \
  --decode-batches 2,8 --part-timeout 300 --out "$R" --stem "model_decode_${S}"
call_end
