#!/usr/bin/env bash
# Session 33, GPU call 1: the batch decode kernels (twell.ops.decode_batch_kernels: cuBLAS gate, an up kernel writing
# h^T for the firing units, the down projection split over unit ranges, a partial sum) against the decode kernels and
# the dense FFN, CUDA-graph GPU time, 1-64 tokens, 0.5 / 2 %, d=2048 F=5632 and d=4096 F=14336; then their
# configurations at 8 and 64 tokens.  Predicted at d=2048, 0.5 %: two tokens ~17 us (decode kernels 33, dense 31),
# eight ~20 us (38), 64 ~26 us against dense ~33 (the decode kernels ~3x dense); at 2 % and 64 tokens about dense.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session33 1
summary() {  # the probe log's per-point times, short
  python3 - "$1" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    h = re.match(r"(d=\s*\d+ F=\s*\d+ M=\s*\d+ dens=\s*[\d.]+%)", line)
    if not h:
        if line.startswith("batch d=") or "FAILED" in line:
            print(line.rstrip()[:1500])
        continue
    g = lambda pat: (re.search(pat, line) or [None, "-"])[1]
    print(h[1], "dense", g(r"dense ([\d.]+) hidden"), "decode-op", g(r"down_um [\d.]+ op ([\d.]+)"),
          "1pass", g(r"one pass: op ([\d.]+)"), "batch", g(r"batch kernels: op ([\d.]+)"),
          "view", g(r"Wd\^T view ([\d.]+)"), "gate", g(r"gate: gate ([\d.]+)"), "up", g(r"up ([\d.]+), down"),
          "down", g(r"down ([\d.]+)\) dense"), "d/b", g(r"\) dense/op ([\d.]+) rel"), "rel", g(r"\) dense/op [\d.]+ rel (\S+)"),
          "union", g(r"union (\d+)"), "repro", g(r"reproducible (\w+)"))
PY
}
stage decode_probe_batch "$(left 330)" "^NVIDIA" python3 scripts/decode_probe.py --ms 1,2,4,8,16,32,64
summary "$R/decode_probe_batch_call1_session33.log"
stage decode_probe_batch_variants "$(left 560)" "^NVIDIA" python3 scripts/decode_probe.py --ms 1 --batch-variants \
  --variant-ms 8,64
summary "$R/decode_probe_batch_variants_call1_session33.log"
call_end
