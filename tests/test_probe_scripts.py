"""The GPU probe scripts' smoke tests: each runs its ``--device cpu --tiny`` problem under the Triton
interpreter and reports agreement, so a device call (30 minutes a session) is not spent on a script that
fails to import or to build its kernels."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: script -> (arguments before ``--device cpu --tiny``, the prefix of its result lines, what those lines must
#: say: kernels agreeing with their reference, each part of the probe reached)
PROBES = {
    "triton_gemm_probe.py": ((), "M=", ["ok True"]),
    "clock_probe.py": ((), "M=", ["dense FFN: "]),
    "hot_cold_gate_probe.py": ((), "M=", ["counts equal 2/2", "rel vs unfused 0.0e+00"]),
    "ncu_targets.py": ((), "M=", ["ok True"]),
    "cold_pack_gather_probe.py": ((), "M=", ["same pairs True", "same True"]),
    "l2_gather_probe.py": ((), "M=", ["ok True"]),
    # FUSED_TMA_HOT: a switch whose two values take different paths under the interpreter too
    "fused_gate_ab.py": (("FUSED_TMA_HOT",), "M=", ["FUSED_TMA_HOT=True | hot/cold op", "bit for bit: True"]),
    "hot_threshold_probe.py": ((), "M=", ["dense FFN: ", "threshold 0.030 H=", "rel vs first"]),
    "attention_probe.py": ((), "", ["default ", "q, k, v projections", "residual add + rms_norm"]),
}


@pytest.mark.parametrize("script", sorted(PROBES))
def test_probe_runs_on_the_interpreter(script):
    args, prefix, wants = PROBES[script]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args, "--device", "cpu", "--tiny"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(prefix)]
    assert lines, proc.stdout
    for want in wants:
        assert any(want in ln for ln in lines), (want, proc.stdout)
    assert not any(bad in proc.stdout for bad in ("FAILED", "same False", "ok False", "bit for bit: False"))
    if script == "hot_cold_gate_probe.py":  # every configuration timed: counts equal and the op identical
        n_configs = len(runpy.run_path(str(ROOT / "scripts" / script), run_name="probe_configs")["CONFIGS"])
        assert proc.stdout.count("counts equal 2/2") == n_configs
        assert proc.stdout.count("rel vs unfused 0.0e+00") == n_configs
