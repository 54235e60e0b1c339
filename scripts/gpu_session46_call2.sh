#!/usr/bin/env bash
# Session 46, second call (H100 machine): why the recorded 1.5B backbone ran sparse at 0.787x of dense at 4096 tokens
# (35.45 vs 27.90 ms, model_forward_recorded_b2_session46.json).  Predicted, if inductor skipped the sparse graph's CUDA
# graphs: cudagraph skips > 0 or graph breaks, the held sparse call's host ms ~30+ (the dense one's ~1), its GPU ms
# ~21-22; if instead the traced path's per-call weight copies cost GPU time: no skips, host ~1 ms, GPU ms ~35 with
# copy / gather kernels near the top.
#   TWELL_COMMIT=<sha> bash scripts/gpu_session46_call2.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session46 2
stage recorded_forward_probe "$(left 500)" "^tokens=|^ {4}|skip|Error" \
  python3 scripts/recorded_forward_probe.py --tokens 4096 8192 --out "$R"
call_end
