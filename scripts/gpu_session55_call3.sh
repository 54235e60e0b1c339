#!/usr/bin/env bash
# Session 55, GPU call 3: `twell train --compile` (31e7a08) on the GPU for the first time, inductor, against the eager
# loop, tiny preset, hot-cold training FFN, 30 steps each on the stdlib corpus: a functional
# check of the compiled recipe (dead-unit hook and hot-set choice eager inside the step), not a speed figure (a fresh
# model is dense).  Predictions: bench_results/<gpu>/session55_runs.md, written before the call.
#   TWELL_COMMIT=<sha> bash scripts/gpu_session55_call3.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session55 3
nvidia-smi --query-gpu=name --format=csv,noheader
for ffn in hot-cold; do
  for mode in eager compile; do
    flag=""; [ "$mode" = compile ] && flag="--compile"
    stage "train_${ffn}_${mode}" "$(left 400)" "Error|error|Traceback|final|eval" python3 -m twell.cli train \
      --preset tiny --steps 30 --eval-every 10 --train-ffn "$ffn" $flag --no-progress --max-bytes 2000000 \
      --out "$R/train_${ffn}_${mode}"
    python3 - "$R/train_${ffn}_${mode}/train_log.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"no train log: {e}")
logs = d["logs"]
print(sys.argv[1].split("/")[-2], "seconds", round(d["seconds"], 2), "lm_loss", [round(x["lm_loss"], 4) for x in logs[::5]],
      "l0", round(logs[-1]["l0"], 2), "eval", [round(e["eval_loss"], 4) for e in d["eval_logs"]])
PY
  done
done
call_end
