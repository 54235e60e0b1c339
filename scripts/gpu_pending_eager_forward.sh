#!/usr/bin/env bash
# Session 40's question, prepared again in session 41: the 1.5B model's eager forward at small token counts, where the
# host may be the bottleneck.  Session 40 measured the hot/cold op's host time at 442-957 us a call on the GPU machines
# (the dense chain's 76-119 us, bench_results/h200/session40_runs.md), while every FFN benchmark and dispatch table
# times the GPU held, as a model whose host runs ahead.  scripts/eager_floor_probe.py builds and calibrates the model
# once and times eager forwards of 1024-16,384 tokens by the wall clock (dense, the default policy, always-sparse,
# interleaved), then prints the smallest DispatchPolicy.eager_min_tokens that keeps each at >= 0.95x of dense.
# Predicted (per layer: dense ~20 torch ops ~0.3 ms of host against ~0.2 ms of GPU at 1024 tokens; the sparse FFN adds
# ~0.4-0.8 ms of host): default against dense ~0.3-0.5x at 1024 tokens (the table sends 1024 tokens at 0.5 % sparse),
# ~0.8-1.0x at 4096, >= 1.3x at 16,384.  If so, set DEFAULT_POLICY's eager_min_tokens from the printed floor (and
# check it on the other machine kind).  ~2-3 minutes.
# Then (session 42) the same question for one layer: twell tune-dispatch --eager at 2048 x 5632 (7 counts x 4
# densities; each point timed held and eagerly, back to back).  Predicted from session 40's host times (the op
# 442-957 us a call) against the held GPU times (dense ~0.23 ms at 2048 tokens, ~0.45 ms at 4096, ~0.9 ms at 8192;
# sparse 1.2-2x less): eager sparse loses at 1024-4096 tokens (~0.2-0.8x), ~0.9-1.2x at 8192, wins at 16,384; the
# printed eager_min_tokens 8192 or 16384.  ~1-2 minutes.
#   TWELL_SESSION=session42 TWELL_COMMIT=<sha> bash scripts/gpu_pending_eager_forward.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session42}" eagerfwd
stage eager_floor_probe "$(left 400)" "tokens=|eager floor|Error|error" \
  python3 scripts/eager_floor_probe.py --policies default always-sparse --out "$R"
[ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/eager_floor_probe_call${CALL}_$S.json"
stage tune_eager_2048x5632 "$(left 560)" "eager|Error|WRONG|wrote" \
  python3 -m twell.cli tune-dispatch --shape 2048x5632 --ms 256 512 1024 2048 4096 8192 16384 \
  --densities 0.5 1 2 5 --eager --out "$R" --stem "dispatch_eager_2048x5632_call${CALL}_$S"
call_end
