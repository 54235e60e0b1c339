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
#: script -> what each of its result lines must say (kernels agreeing with their reference)
PROBES = {
    "triton_gemm_probe.py": ["ok True"],
    "clock_probe.py": ["dense FFN: "],
    "hot_cold_gate_probe.py": ["counts equal 2/2", "rel vs unfused 0.0e+00"],
    "ncu_targets.py": ["ok True"],
    "cold_pack_gather_probe.py": ["same pairs True", "same True"],
    "l2_gather_probe.py": ["ok True"],
}


@pytest.mark.parametrize("script", sorted(PROBES))
def test_probe_runs_on_the_interpreter(script):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--device", "cpu", "--tiny"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("M=")]
    assert lines, proc.stdout
    for want in PROBES[script]:
        assert any(want in ln for ln in lines), (want, proc.stdout)
    assert "FAILED" not in proc.stdout and "same False" not in proc.stdout and "ok False" not in proc.stdout
    if script == "hot_cold_gate_probe.py":  # every configuration timed: counts equal and the op identical
        n_configs = len(runpy.run_path(str(ROOT / "scripts" / script), run_name="probe_configs")["CONFIGS"])
        assert proc.stdout.count("counts equal 2/2") == n_configs
        assert proc.stdout.count("rel vs unfused 0.0e+00") == n_configs
