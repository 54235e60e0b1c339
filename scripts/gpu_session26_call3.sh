#!/usr/bin/env bash
# Session 26, GPU call 3 (the gate's hot tiles last with the list pass beside it; as call 2 otherwise:
# the hot/cold tail's GPU tests, scripts/tail_probe.py (the beside variants against the shipped
# launches), then, if the probe's "beside@1" beat "now+pdl" at 16384 tokens, the FFN headline with the list pass
# beside the gate (hot_cold.LIST_BESIDE_GATE on, its defaults). OUT from the caller; files packed into
# $OUT/results_call3_session26.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src:scripts PYTHONUNBUFFERED=1
S=session26
R="$OUT/run"
mkdir -p "$R"
T0=$SECONDS
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ops_hot_cold_tail.py > "$R/pytest_gpu_tail_call3_$S.log" 2>&1
echo "pytest rc=$?"; grep -E "FAILED|passed|failed|Error" "$R/pytest_gpu_tail_call3_$S.log" | tail -8
timeout 300 python3 scripts/tail_probe.py > "$R/tail_probe_call3_$S.log" 2>&1
echo "tail probe rc=$?"; grep "interleaved\|bit for bit\|_hot_cold_gate_kernel\|_list_twell\|back to back" "$R/tail_probe_call3_$S.log" | cut -c1-330
WIN=$(python3 - "$R/tail_probe_call3_$S.log" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    if line.startswith("M= 16384") and "interleaved" in line:
        t = dict(re.findall(r"op (\S+) ([0-9.]+) ms", line))
        print(1 if float(t["beside@1"]) < 0.995 * float(t["now+pdl"]) else 0)
        break
else:
    print(0)
PY
)
echo "beside@1 wins at 16384: $WIN"
LEFT=$(( 560 - (SECONDS - T0) ))
if [ "$WIN" = 1 ] && [ "$LEFT" -gt 120 ]; then
  timeout "$LEFT" python3 -c "
import sys
from twell.ops import hot_cold
hot_cold.LIST_BESIDE_GATE = True
from twell.cli import main
sys.exit(main(sys.argv[1:]))" bench ffn --shape 2048x5632 --ms 16384 131072 --densities 0.5 1 --extra \
    --energy-seconds 1 --out "$R" --stem ffn_headline_beside_$S > "$R/ffn_headline_beside_$S.log" 2>&1
  echo "headline rc=$?"; grep "^| 2048" "$R/ffn_headline_beside_$S.log"
fi
LEFT=$(( 575 - (SECONDS - T0) ))
if [ "$LEFT" -gt 60 ]; then  # the whole GPU suite in what time is left (its last run took 285 s)
  timeout "$LEFT" python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$R/pytest_gpu_all_$S.log" 2>&1
  echo "gpu suite rc=$?"; grep -E "FAILED|passed|failed" "$R/pytest_gpu_all_$S.log" | tail -6
fi
tar czf "$OUT/results_call3_$S.tgz" -C "$OUT" run && rm -rf "$R"
