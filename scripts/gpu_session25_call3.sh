#!/usr/bin/env bash
# Session 25, GPU call 3 (hot_cold.LIST_BESIDE_GATE on; cold-down path given contiguous counts): the whole GPU test
# suite, the FFN headline in one run, then scripts/tail_probe.py with the "beside" variant in what time is left.
# OUT, TWELL_COMMIT from the caller; files packed into $OUT/results_call3_session25.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src:scripts PYTHONUNBUFFERED=1
S=session25
R="$OUT/run"
mkdir -p "$R"
T0=$SECONDS
timeout 375 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests > "$R/pytest_gpu_all_$S.log" 2>&1
echo "pytest rc=$?"; grep -E "FAILED|passed|failed" "$R/pytest_gpu_all_$S.log" | tail -6
timeout 140 python3 -m twell.cli bench ffn --shape 2048x5632 --ms 16384 131072 --densities 0.5 1 --extra \
  --energy-seconds 1 --out "$R" --stem ffn_headline_beside_$S > "$R/ffn_headline_beside_$S.log" 2>&1
echo "headline rc=$?"; grep "^| 2048" "$R/ffn_headline_beside_$S.log"
LEFT=$(( 575 - (SECONDS - T0) ))
if [ "$LEFT" -gt 30 ]; then
  timeout "$LEFT" python3 scripts/tail_probe.py > "$R/tail_probe_beside_$S.log" 2>&1
  echo "tail probe rc=$?"; grep "interleaved\|bit for bit" "$R/tail_probe_beside_$S.log" | cut -c1-460
fi
tar czf "$OUT/results_call3_$S.tgz" -C "$OUT" run && rm -rf "$R"
