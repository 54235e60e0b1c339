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
    "fused_gate_ab.py": (("FUSED_TMA_HOT",), "M=", ["changed | hot/cold op", "changed | cold gather",
                                                    "bit for bit: True"]),
    "hot_threshold_probe.py": ((), "M=", ["dense FFN: ", "threshold 0.030 H=", "bound  1.0 H=", "rel vs first"]),
    "epilogue_ablation_probe.py": ((), "M=", ["cold epilogue skipped", "hot epilogue skipped", "mainloop alone"]),
    # (the steep sequence head and the held-sparse policy of session 52's call 4 parsed and applied; session 53's
    # long-row pair bound and session 54's small-batch pass parsed; the tiny layer takes no hot/cold plan, so no
    # longest rows are printed)
    "infer_op_profile.py": (("--timeline", "--hold-ms", "2", "--early-boost", "40", "--early-decay", "4", "--policy",
                             "sparse", "--severe-pairs", "256", "--batch-pass-rows", "64"), "M=",
                            ["module: ran", "module timeline (GPU held 2 ms",
                             "sequence head early_boost=40 early_decay=4, policy sparse"]),
    "op_host_time.py": ((), "M=", ["dense chain : host", "module      : host", "hot/cold op : host", "cProfile of 2"]),
    "forward_layer_times.py": ((), "layer", ["overflowing cold tiles"]),
    "forward_unions.py": ((), "", ["layer  0: l0", "independent", "synthetic M=256 l0 target 28"]),
    # the shipped rule at the smoke test's 32 tokens: 1.3 % and at most 3 cold pairs (HOT_MAX_COLD_L0_SMALL)
    "forward_hot_sets.py": ((), "", ["each layer's best rule", "0.013:3", "1.000:none"]),
    "hot_down_probe.py": ((), "M=", ["rel err 0.0e+00", "(on vs off rel 0.0e+00)"]),
    "attention_probe.py": ((), "", ["default ", "q, k, v projections", "residual add + rms_norm",
                                          "o projection + residual add", "FFN down projection + residual add"]),
    "residual_probe.py": ((), "", ["sum bit for bit True", "); bit for bit True", "dense FFN + residual: "]),
    "memset_source_probe.py": ((), "M=", ["mm fp32 out: ran", "list pass: ran"]),
    "tail_probe.py": ((), "M=", ["across variants True; module True", "interleaved | dense",
                                 "back to back | op beside"]),
    "fp8_screen_probe.py": ((), "M=", ["margin est k=0.1:", "margin norms k=0.05:", "speed: not timed"]),
    # every up-kernel configuration built and the down kernel timed on both flag sets; none/real/all firing counts
    "batch_up_probe.py": ((), "d=", ["real(2048, 1, 4) ", "down_real ", "firing units none/real/all 0/"]),
    # every token count timed for each variant, always-sparse's layers sparse, a floor printed for each; the default's
    # graphed variant added (always-sparse sets no floor: none for it), nothing recorded off CUDA
    "eager_floor_probe.py": (("--graphs", "4", "--hot-sets", "1"), "",
                             ["tokens=    64 | dense ", "sparse:always-sparse_sparse_layers 2",
                                                     "sparse:default+graphs_recorded_layers 0",
                                                     "eager floor for 'default' at bar 0.95: eager_min_tokens = ",
                                                     "eager floor for 'always-sparse' at bar 0.95",
                                                     "eager floor for 'default+graphs' at bar 0.95",
                                                     # no floor, but calls above it up to RECORD_MAX_FLOPS record
                                                     "eager floor for 'always-sparse+graphs' at bar 0.95"]),
    # one layer per number of hot sets, each exact, its hot units named (the tiny layer's two classes take equal sets)
    "hot_sets_probe.py": ((), "tokens=", ["tokens=     40 | dense ", "| sets1 ", "| sets3 ", " hot, err ", "ok True"]),
    # each token count's forwards timed interleaved and alone, and both sets profiled
    "eager_stall_probe.py": ((), "", ["tokens=    64 dense ", "(alone ", "sparse stalls: ", "dense stalls: "]),
    # per token count both sets' layers' host and GPU time, the wall clock with the refresh on and off, the launches;
    # then the sparse forward's cProfile
    "model_host_time.py": ((), "", ["tokens=    16 | dense layers host ", "(refresh on ", "sparse layers host ",
                                    "cProfile of one sparse forward at 32 tokens", "_ffn_sparse"]),
    # both sets compiled (aot_eager off CUDA) in one graph each, nothing skipped, the eager layers timed beside them;
    # (the dense-row, hot-set, fused-pass, heavy-row and cached-weights switches parsed and applied without error)
    # every layer's split at each bound with the long-row rule and the budget that counts them, the rows left to the
    # row kernel counted
    "heavy_rows_stats.py": (("--heavy-pairs", "2", "--count-heavy"), "layer",
                            ["bound  3.0 heavy 2 counted: l0", "bound 10.0 heavy 2 counted: l0",
                             "left rows over 16/32/64/128 pairs", "heaviest left"]),
    # every training implementation's checked gradients and each layer's gate flips against the float32 model
    "train_check_flips.py": ((), "", ["seed 0 dense ", "seed 0 sparse-reference ", "seed 0 hot-cold ",
                                      "layers.0.mlp.down_proj ", "    layer 1: "]),
    "recorded_forward_probe.py": (("--min-expected", "1", "--severe-tiles", "3", "--severe-pairs", "128",
                                   "--small-bound", "3", "--fused-pass", "--batch-pass-rows", "64", "--causal-skip",
                                   "--heavy-pairs", "2", "--count-heavy", "--cached-weights"),
                                  "tokens=",
                                  ["tokens=32 dense: wall ", "graph breaks 0, unique graphs 1, cudagraph skips 0",
                                   "tokens=32 sparse:always-sparse: wall ",
                                   "sparse:always-sparse eager: wall ", "; decoder layers held, host ",
                                   "sparse:always-sparse: hot units "]),
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
    if script == "infer_op_profile.py":  # a timeline under each function's header: medians, then the median call
        assert proc.stdout.count("calls, medians: span") == proc.stdout.count(" timeline (GPU held") >= 1, proc.stdout
    if script == "hot_cold_gate_probe.py":  # every configuration timed: counts equal and the op identical
        n_configs = len(runpy.run_path(str(ROOT / "scripts" / script), run_name="probe_configs")["CONFIGS"])
        assert proc.stdout.count("counts equal 2/2") == n_configs
        assert proc.stdout.count("rel vs unfused 0.0e+00") == n_configs


def test_fused_gate_ab_parses_switches_and_settings(monkeypatch):
    """``scripts/fused_gate_ab.py``'s changes: a boolean switch flips, ``module.NAME=value`` sets a constant of a
    twell.ops module; an unknown name, a non-boolean switch or a value of another type stops with its name."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    parse = runpy.run_path(str(ROOT / "scripts" / "fused_gate_ab.py"), run_name="probe")["parse_changes"]
    from twell.ops import hot_cold_gate_kernel, twell_list_kernel

    (mod, name, shipped, other), (mod2, name2, shipped2, other2) = parse("FUSED_TMA_HOT,twell_list_kernel.LIST_MAX=128")
    assert (mod, name, shipped, other) == (hot_cold_gate_kernel, "FUSED_TMA_HOT", False, True)
    assert (mod2, name2, shipped2, other2) == (twell_list_kernel, "LIST_MAX", twell_list_kernel.LIST_MAX, 128)
    spec = "hot_cold_gate_kernel._GPU_CONFIG=(128, 64, 4, 8),FUSED_FLATTEN"  # a tuple's commas stay inside
    (_, name3, shipped3, other3), (_, name4, shipped4, other4) = parse(spec)
    assert (name3, shipped3, other3) == ("_GPU_CONFIG", hot_cold_gate_kernel._GPU_CONFIG, (128, 64, 4, 8))
    # a switch is set to the opposite of its shipped value (the flattened loop is shipped on since session 17)
    assert (name4, shipped4, other4) == ("FUSED_FLATTEN", hot_cold_gate_kernel.FUSED_FLATTEN,
                                         not hot_cold_gate_kernel.FUSED_FLATTEN)
    for bad, words in (("NO_SUCH_SWITCH", "NO_SUCH_SWITCH"), ("PTX_SLOTS_TRITON", "PTX_SLOTS_TRITON"),
                       ("twell_list_kernel.LIST_MAX=1.5", "must be of type int"), ("no_module.X=1", "no_module.X=1")):
        with pytest.raises(SystemExit, match=words):
            parse(bad)


def test_epilogue_ablation_is_off_in_the_shipped_kernel():
    """``PROBE_SKIP_EPILOGUE`` leaves outputs unwritten: only the ablation probe may set it, and resets it."""
    from twell.ops import hot_cold_gate_kernel

    assert hot_cold_gate_kernel.PROBE_SKIP_EPILOGUE == 0


def test_pingpong_gemm_probe_builds_for_sm90_offline():
    """The Gluon ping-pong GEMM probe has no interpreter run: its smoke test is the sm_90a build, both outputs."""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT / 'scripts'}")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "pingpong_gemm_probe.py"), "--compile-only"],
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("store ")]
    assert len(lines) == 2 and all("'spill_bytes': 0," in ln for ln in lines), proc.stdout


@pytest.mark.parametrize(("args", "words"), [(("--tiny",), "no interpreter run"), (("--stages", "9"), "2 to 6")])
def test_pingpong_gate_probe_refuses_what_it_cannot_run(args, words):
    """The ping-pong gate probe is GPU only (Gluon): on the CPU it names why it stops, before any device work."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT / 'scripts'}")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "pingpong_gate_probe.py"), "--device", "cpu", *args],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0 and words in proc.stderr, proc.stderr[-2000:]


def test_gather_schedule_model_runs_and_orders_heavy_rows_first():
    """scripts/gather_schedule_sim.py (the CPU model behind GATHER_HEAVY_FIRST) on a small problem: each schedule's
    makespan is at least its lower bound, and the heaviest-first order is no longer than the index order."""
    import re

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gather_schedule_sim.py"), "--m", "2048", "--l0",
                           "28"], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    in_order, heaviest, split = (float(v) for v in re.findall(r"(\d+\.\d+)x", line))
    assert line.startswith("M=  2048 l0=  28") and min(in_order, heaviest, split) >= 1.0 and heaviest <= in_order


def test_forward_hot_sets_parses_rules(monkeypatch):
    """``--rules FREQ:BOUND``: good values parse (``none``: no bound), bad ones stop with what a rule must be."""
    import argparse

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    ns = runpy.run_path(str(ROOT / "scripts" / "forward_hot_sets.py"), run_name="probe")
    assert ns["parse_rule"]("0.02:none") == (0.02, None)
    assert ns["parse_rule"]("0.013:12.5") == (0.013, 12.5)
    assert ns["rule_name"]((0.02, None)) == "0.020:none"
    for bad in ("0.02", "0:10", "1.5:10", "0.02:-1", "0.02:nan", "x:1"):
        with pytest.raises(argparse.ArgumentTypeError, match="rule"):
            ns["parse_rule"](bad)


def test_hot_threshold_probe_parses_points_and_bounds(monkeypatch):
    """``--points M:L0`` and ``--bounds B``: good values parse, bad ones stop with what a value must be."""
    import argparse

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    ns = runpy.run_path(str(ROOT / "scripts" / "hot_threshold_probe.py"), run_name="probe")
    assert ns["parse_point"]("4096:168") == (4096, 168.0)
    assert ns["parse_bound"]("7.5") == 7.5
    for bad in ("4096", "0:28", "4096:0", f"4096:{ns['F']}", "x:1"):
        with pytest.raises(argparse.ArgumentTypeError, match="point"):
            ns["parse_point"](bad)
    for bad in ("0", "-1", "nan", "ten"):
        with pytest.raises(argparse.ArgumentTypeError, match="cold pairs per token > 0"):
            ns["parse_bound"](bad)
    assert ns["parse_threshold"]("0.02") == 0.02
    for bad in ("0", "1.5", "nan", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="threshold is a firing frequency"):
            ns["parse_threshold"](bad)


def test_op_host_time_ab_alternates_both_launch_paths_with_the_same_output():
    """``op_host_time.py --ab``: the module and the op timed on the shipped launch path and on the one before session
    40's trim (the custom op, ``triton.cdiv``), in one process, with bit-identical outputs."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "op_host_time.py"), "--ab", "2", "--device", "cpu",
                           "--tiny"], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if " A/B " in ln]
    assert [ln.split(" A/B ")[1].split(":")[0].strip() for ln in lines] == ["module", "hot/cold op"], proc.stdout
    assert all("same output True" in ln and "medians of 2 rounds" in ln for ln in lines), proc.stdout


@pytest.mark.parametrize("points, bar, want", [
    ([(1024, 0.5), (2048, 0.9), (4096, 1.2), (8192, 1.3)], 0.95, 4096),  # losses below 4096: the floor is there
    ([(1024, 1.1), (2048, 0.9), (4096, 1.2)], 0.95, 4096),  # a loss above a win still moves the floor past it
    ([(1024, 1.0), (4096, 1.4)], 0.95, 0),  # nothing below the bar: no floor
    ([(4096, 1.2), (1024, 0.5)], 0.95, 4096),  # any order
    ([(1024, 1.1), (2048, None)], 0.95, 2049),  # a failed variant loses; no larger count measured: one token past
    ([(1024, 0.97)], 1.0, 1025),
])
def test_eager_floor_probe_suggests_the_smallest_floor_that_keeps_every_point(points, bar, want):
    floor = runpy.run_path(str(ROOT / "scripts" / "eager_floor_probe.py"), run_name="probe")["suggested_floor"]
    assert floor([{"tokens": n, "speedup": s} for n, s in points], bar) == want
