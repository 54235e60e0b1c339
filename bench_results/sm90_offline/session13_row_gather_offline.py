"""Offline sm_90a builds of the row-gather kernel (session 13): registers / spills per variant, and the
main loop's SASS per step.  Run with PYTHONPATH pointing at the tree to build."""
import collections, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from twell.ops.compile_check import _compile, _usage, _ptxas
from twell.ops.twell_ffn_kernel import _twell_ffn_row_kernel
import inspect
target = GPUTarget("cuda", 90, 32)
sig = {n: "*bf16" for n in ("x_ptr", "wg_ptr", "wu_ptr", "wdt_ptr", "out_ptr", "val_ptr", "spill_ptr")}
sig.update({"idx_ptr": "*i16", "cnt_ptr": "*i32", "spill_slot_ptr": "*i32", "unit_map_ptr": "*i32",
            "init_ptr": "*fp32", "taken_ptr": "*i8", "F": "i32", "D": "i32", "n_tiles": "i32",
            "stride_xm": "i32", "stride_om": "i32", "stride_im": "i32"})
params = inspect.signature(_twell_ffn_row_kernel.fn).parameters
def build(dpad=2048, sb=4, warps=4, divisible=True, maxnreg=None, nt_pad=64, **flags):
    c = {"TILE": 128, "CAP": 16, "NT_PAD": nt_pad, "D_PAD": dpad, "SB": sb, "GATED": True, "HAS_SPILL": False,
         "ROUND_HIDDEN": True, "HAS_MAP": True, "HAS_INIT": True, "IDX_IS_UNIT": True, "PRELOAD": False,
         "PREFETCH": False}
    c.update({k: v for k, v in flags.items() if k in params})
    opts = {"num_warps": warps}
    if maxnreg: opts["maxnreg"] = maxnreg
    return _compile(_twell_ffn_row_kernel, sig, c, target, divisible=("D", "stride_xm", "stride_om", "stride_im") if divisible else (), **opts)
def loop(ptx):
    d = tempfile.mkdtemp()
    open(f"{d}/k.ptx", "w").write(ptx)
    subprocess.run([_ptxas(), "-arch=sm_90a", f"{d}/k.ptx", "-o", f"{d}/k.cubin"], check=True)
    sass = subprocess.run([os.path.join(os.path.dirname(_ptxas()), "nvdisasm"), "-c", f"{d}/k.cubin"], capture_output=True, text=True).stdout.splitlines()
    lab = {m.group(1): i for i, l in enumerate(sass) if (m := re.match(r"^(\.L_x_\d+):", l.strip()))}
    for i, l in enumerate(sass):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", l)
        if m and lab.get(m.group(1), 10**9) < i:
            start, end = lab[m.group(1)], i; break
    ops = collections.Counter()
    for l in sass[start:end + 1]:
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(@!?P\d+\s+)?([A-Z0-9_]+)", l)
        if m: ops[m.group(2)] += 1
    return sum(ops.values()), ops.most_common(16)
for name, kw in [(a, b) for a, b in eval(sys.argv[1])]:
    ptx = build(**kw)
    n, ops = loop(ptx)
    print(f"{name}: {_usage(ptx, 90)}; main loop {n} SASS instructions per warp and step: {ops}", flush=True)
