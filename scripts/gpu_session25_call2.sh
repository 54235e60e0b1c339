#!/usr/bin/env bash
# Session 25, GPU call 2 (hot_cold.LIST_PDL on): the FFN headline in one run (16,384 and 131,072 tokens at 0.5 and
# 1 %, back to back with energy too), then the whole GPU test suite.  OUT, TWELL_COMMIT from the caller; files
# packed into $OUT/results_call2_session25.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session25
R="$OUT/run"
mkdir -p "$R"
timeout 170 python3 -m twell.cli bench ffn --shape 2048x5632 --ms 16384 131072 --densities 0.5 1 --extra \
  --energy-seconds 1 --out "$R" --stem ffn_headline_$S > "$R/ffn_headline_$S.log" 2>&1
echo "headline rc=$?"; grep -v "^ " "$R/ffn_headline_$S.log" | tail -12 | cut -c1-330
timeout 30 python3 scripts/memset_source_probe.py > "$R/memset_source_probe_$S.log" 2>&1
echo "memset probe rc=$?"; grep -v "^ *$" "$R/memset_source_probe_$S.log" | cut -c1-160
timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$R/pytest_gpu_all_$S.log" 2>&1
echo "pytest rc=$?"; grep -E "FAILED|passed|failed" "$R/pytest_gpu_all_$S.log" | tail -8
tar czf "$OUT/results_call2_$S.tgz" -C "$OUT" run && rm -rf "$R"
