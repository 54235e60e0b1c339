# Sourced by the per-session GPU call scripts (scripts/gpu_sessionNN_callK.sh) and scripts/gpu_all.sh: the lines
# every call began with (sessions 22-26 copied them), a stage under a time limit that prints its log's key lines, the probe's
# "did variant A beat B" test, a forward JSON's summary, and the packing of $OUT/run into one archive.  Usage, in a call script:
#   . "$(dirname "$0")/gpu_call_lib.sh"; call_begin session27 1; ...; call_end
# A stage that times a variant of a shipped constant runs the CLI through scripts/twell_patched.py:
#   stage NAME LIMIT PATTERN python3 scripts/twell_patched.py --set twell.ops.hot_cold_plan.HOT_MAX_COLD_L0=6.0 -- ARGS
# OUT comes from the device tool.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=src:scripts PYTHONUNBUFFERED=1

write_environment() {  # file: the GPU, driver and clocks, the torch / Triton / CUDA versions, the commit
  {
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
    echo "commit ${TWELL_COMMIT:-unknown}"
  } > "$1" 2>&1
}

call_begin() {  # session tag, call number: sets S, CALL, R (the results folder) and T0; writes the environment
  S=$1 CALL=$2 R="$OUT/run" T0=$SECONDS
  mkdir -p "$R"
  write_environment "$R/environment_call${CALL}_$S.txt"
}

left() {  # seconds left of the call's budget (first argument) since call_begin
  echo $(( $1 - (SECONDS - T0) ))
}

stage() {  # log name, limit (s), grep pattern for the lines printed, command...
  local name=$1 limit=$2 pattern=$3
  shift 3
  if [ "$limit" -le 20 ]; then echo "$name skipped: ${limit}s left"; return 0; fi
  local start=$SECONDS
  timeout "$limit" "$@" > "$R/${name}_call${CALL}_$S.log" 2>&1
  echo "$name rc=$? in $((SECONDS - start))s"
  grep -E "$pattern" "$R/${name}_call${CALL}_$S.log" | cut -c1-420 | tail -n 40
}

probe_beats() {  # probe log, tokens, variant A, variant B, fraction: prints 1 if op A's median < fraction * op B's
  python3 - "$@" <<'PY'
import re, sys
log, m, a, b, frac = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
for line in open(log):
    if line.startswith(f"M={m:>6}") and "interleaved" in line:
        t = dict(re.findall(r"op (\S+) ([0-9.]+) ms", line))
        print(1 if a in t and b in t and float(t[a]) < frac * float(t[b]) else 0)
        break
else:
    print(0)
PY
}

part_summary() {  # twell bench model's JSON, part, keys...: each variant's values of those keys, one line each
  python3 - "$@" <<'PY'
import json, sys
path, part, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    variants = json.load(open(path))["meta"]["parts"][part]["result"]["variants"]
except (OSError, ValueError, KeyError) as e:
    sys.exit(f"no {part} JSON: {e}")
for name, v in variants.items():
    print(part, name, *(f"{k} {str(v.get(k))[:300]}" for k in keys))
PY
}

forward_summary() {  # the forward part: eager and compiled figures
  part_summary "$1" forward ms speedup compiled_ms compiled_speedup error
}

train_summary() {  # the train part: step time, speedup, tokens spilled to the dense recompute
  part_summary "$1" train ms speedup layer_spilled_tokens_last_step error
}

call_end() {  # pack everything under $R into one archive (the device tool returns few files)
  tar czf "$OUT/results_call${CALL}_$S.tgz" -C "$OUT" run && rm -rf "$R"
}
