#!/usr/bin/env bash
# Session 33, GPU call 2.  Call 1 (d=2048, F=5632, 0.5 %): the split batch kernels at 27-29 us for 2-16 tokens against
# dense 31 (gate 8.3 + up 10.1 + down with its partial sum 7.6-8.6: each launch a chain of dependent round trips, not
# bytes).  Here the fused kernel (decode_batch_kernels._batch_updown_kernel: up and down in one (column block, unit
# range) grid, three launches in all).  Predicted at d=2048, 0.5 %: ~19 us at 2-16 tokens (dense 31); at d=4096,
# F=14336: ~60 us at 8 tokens against dense 97 (split kernels 84).  Then its configurations at 2, 8 and 16 tokens.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session33 2
summary() {  # the probe log's per-point times, short
  python3 - "$1" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    h = re.match(r"(d=\s*\d+ F=\s*\d+ M=\s*\d+ dens=\s*[\d.]+%)", line)
    if not h:
        if line.startswith("batch d=") or "FAILED" in line:
            print(line.rstrip()[:2500])
        continue
    g = lambda pat: (re.search(pat, line) or [None, "-"])[1]
    print(h[1], "dense", g(r"dense ([\d.]+) hidden"), "decode-op", g(r"down_um [\d.]+ op ([\d.]+)"),
          "1pass", g(r"one pass: op ([\d.]+)"), "split", g(r"batch kernels: op ([\d.]+)"),
          "(up", g(r"up ([\d.]+), down"), "down", g(r"down ([\d.]+)\) dense") + ")",
          "fused", g(r"fused kernel: op ([\d.]+)"), "view", g(r"fused kernel: op [\d.]+ \(Wd\^T view ([\d.]+)"),
          "gate", g(r"gate: gate ([\d.]+)"), "dense/fused", g(r"dense/fused ([\d.]+)"),
          "rel", g(r"dense/fused [\d.]+ rel (\S+)"), "union", g(r"union (\d+)"), "repro", g(r"reproducible (\w+)"))
PY
}
stage decode_probe_fused "$(left 300)" "^NVIDIA" python3 scripts/decode_probe.py --ms 1,2,4,8,16,32,64
summary "$R/decode_probe_fused_call2_session33.log"
stage decode_probe_fused_variants "$(left 560)" "^NVIDIA" python3 scripts/decode_probe.py --ms 1 --batch-variants \
  --variant-ms 2,8,16
summary "$R/decode_probe_fused_variants_call2_session33.log"
call_end
