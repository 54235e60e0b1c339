#!/usr/bin/env bash
# Session 45, after call 1 (bench_results/h100/session45_runs.md): on the H100 machine the 1.5B model's sparse eager
# forward at 8192 tokens is the host's issuing, not GPU time: the decoder layers' GPU time 35.49 ms sparse against
# 42.46 dense, the host's issuing 32.3-42.9 ms for the sparse layers (17-27 dense), the wall clock 37.7-49.5 ms.
# 1. The backbone compiled (inductor, default mode) at 8192 tokens, the default policy (its eager floor sends the eager
#    calls dense, a compiled call keeps the tables) and the tables alone.  Predicted: compiled sparse ~1.1-1.2x of
#    compiled dense (the GPU's 1.20x less the host time compiling leaves), the eager default ~1.0x, tables < 1.0x.
# 2. The compiled, graphed decode at batch 2 and 8 with session 44's decode tables (session 39 with the old tables on
#    the H200: 1.090x / 1.075x).  Predicted: the same or up to ~2 % better.
#   TWELL_SESSION=session45 TWELL_COMMIT=<sha> bash scripts/gpu_session45_call2.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session45}" 2
nvidia-smi --query-gpu=name --format=csv,noheader
stage model_forward_b4 "$(left 330)" "^\| forward|^total|Error" python3 -m twell.cli bench model --preset 1.5b \
  --parts forward --batch 4 --fused-norms --fused-residual --forward-policies default,tables --forward-compile \
  --out "$R" --stem "model_forward_b4_${S}"
python3 - "$R/model_forward_b4_${S}.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except (OSError, ValueError, KeyError) as e:
    sys.exit(f"no forward JSON: {e}")
for r in rows:
    print("compiled", r.get("variant"), r.get("ms"), "eager ms;", r.get("compiled_ms"), "compiled ms;",
          r.get("compiled_speedup"), "compiled speedup")
PY
stage model_decode "$(left 570)" "^\| decode|^total" python3 -m twell.cli bench model --preset 1.5b --parts decode \
  --fused-norms --fused-residual --decode-loop graphed --decode-compile --decode-policies default \
  --decode-batches 2,8 --part-timeout 300 --out "$R" --stem "model_decode_${S}"
call_end
