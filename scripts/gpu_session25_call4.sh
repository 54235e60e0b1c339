#!/usr/bin/env bash
# Session 25, GPU call 4 (hot_cold.LIST_BESIDE_GATE off again): the whole GPU test suite.  OUT, TWELL_COMMIT from the
# caller; the log packed into $OUT/results_call4_session25.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session25
R="$OUT/run"
mkdir -p "$R"
timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$R/pytest_gpu_all_$S.log" 2>&1
echo "pytest rc=$?"; grep -E "FAILED|passed|failed" "$R/pytest_gpu_all_$S.log" | tail -6
tar czf "$OUT/results_call4_$S.tgz" -C "$OUT" run && rm -rf "$R"
