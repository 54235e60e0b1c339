#!/usr/bin/env bash
# Session 22, GPU call 4: the whole FFN sweep at 2048 x 5632 (issue 3's token counts and densities, 2048 tokens
# added, the 524,288-token point) with the dispatch table as re-cut in session 22.  OUT, TWELL_COMMIT from the caller.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session22
timeout "${T_SWEEP:-420}" python3 -m twell.cli bench ffn --shape 2048x5632 --ms 1 16 256 1024 2048 4096 16384 131072 \
  --out "$OUT" --stem ffn_sweep_dispatch_$S > "$OUT/ffn_sweep_dispatch_$S.log" 2>&1
echo "sweep rc=$?"
grep "M=" "$OUT/ffn_sweep_dispatch_$S.log" | sed 's/gate(twell).*hot-cold/hot-cold/'
