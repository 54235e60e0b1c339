#!/usr/bin/env bash
# Prepared in session 39: the batch decode up kernel's token tiles (decode_batch_kernels._UP_TOKEN_TILE, not
# shipped).  At 33-64 tokens (BM = 64) the shipped launch runs four warps over 64 rows (12.1-12.2 us at d=2048,
# 51.5-55.1 at 4096 x 14336, decode_probe_call1_session39.log), since one warp over 64 rows spills 932 bytes; two
# programs of 32 rows with one warp each build without a spill (202 registers,
# bench_results/sm90_offline/batch_up_ptx_session39.log).  First the decode GPU tests (the tiles' own GPU test among
# them), then scripts/batch_up_probe.py, which now times 64 tokens and the tile variants.  Predicted: tile32(128, 3, 1)
# ~10-10.5 us at d=2048 / 64 tokens against the shipped ~12, ~31-35 at 4096 x 14336 against ~51; if so, ship
# {64: 32} with (128, 3, 1) and time decode_probe.py at 33-64 tokens.  ~2 minutes.
#   TWELL_SESSION=session40 TWELL_COMMIT=<sha> bash scripts/gpu_pending_up_tiles.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session40}" uptiles
stage pytest_gpu_decode "$(left 150)" "passed|failed|FAILED|Error" \
  python3 -m pytest tests -q -m gpu -k "decode or batch" -p no:cacheprovider
stage batch_up_probe "$(left 240)" "d=|FAILED|Error" python3 scripts/batch_up_probe.py
call_end
