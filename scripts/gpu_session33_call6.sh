#!/usr/bin/env bash
# Session 33, GPU call 6.  Call 5: the unrolled partial sum took the op at d=2048, 0.5 % from 27.5 / 29.1 us to 25.0 /
# 26.3 us at 2 / 8 tokens (predicted ~25 / ~26), but PDL with the dependents launched at the kernels' start lost at
# d=4096, F=14336 (0.1188 against 0.1055 ms without PDL at eight tokens).  Now the dependents launch after the last
# store (PDL_EARLY False).  Predicted: d=4096 at eight tokens back to ~0.105 ms or better, d=2048 unchanged (~26 us);
# PDL off and early in the variants at 8 and 64 tokens, with smaller partial budgets.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session33 6
summary() {
  python3 - "$1" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    h = re.match(r"(d=\s*\d+ F=\s*\d+ M=\s*\d+ dens=\s*[\d.]+%)", line)
    if h:
        g = lambda pat: (re.search(pat, line) or [None, "-"])[1]
        print(h[1], "dense", g(r"dense ([\d.]+) hidden"), "op", g(r"down_um [\d.]+ op ([\d.]+)"),
              "batch", g(r"batch kernels: op ([\d.]+)"), "(up", g(r"up ([\d.]+), down"), "down", g(r"down ([\d.]+)\) dense") + ")",
              "rel", g(r"\| rel (\S+) maxrel"), "repro", g(r"reproducible (\w+)"), "union", g(r"union (\d+)"))
    elif line.startswith("batch d=") or "FAILED" in line:
        print(line.rstrip()[:1200])
PY
}
stage decode_probe_final "$(left 400)" "^NVIDIA" python3 scripts/decode_probe.py --ms 1,2,4,8,16,32,64 --batch-variants \
  --variant-ms 8,64
summary "$R/decode_probe_final_call6_session33.log"
call_end
