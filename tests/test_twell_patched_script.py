"""scripts/twell_patched.py: the GPU call scripts' way to run the CLI with a module constant changed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from twell.ops import hot_cold_plan

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "twell_patched.py"


def _load():
    spec = importlib.util.spec_from_file_location("twell_patched", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_setting_replaces_the_constant(monkeypatch):
    patched = _load()
    monkeypatch.setattr(hot_cold_plan, "HOT_MAX_COLD_L0", hot_cold_plan.HOT_MAX_COLD_L0)  # restored afterwards
    patched.apply_setting("twell.ops.hot_cold_plan.HOT_MAX_COLD_L0 = 6.0")
    assert hot_cold_plan.HOT_MAX_COLD_L0 == 6.0 and isinstance(hot_cold_plan.HOT_MAX_COLD_L0, float)


@pytest.mark.parametrize("text, match", [
    ("twell.ops.hot_cold_plan.HOT_MAX_COLD_LO=6.0", "has no attribute 'HOT_MAX_COLD_LO'"),  # a typo is refused
    ("HOT_MAX_COLD_L0=6.0", "MODULE.NAME=VALUE"),
    ("twell.ops.hot_cold_plan.HOT_MAX_COLD_L0", "MODULE.NAME=VALUE"),
    ("twell.ops.hot_cold_plan.HOT_MAX_COLD_L0=six", "Python literal"),
])
def test_bad_settings_name_the_problem(text, match):
    before = hot_cold_plan.HOT_MAX_COLD_L0
    with pytest.raises(ValueError, match=match):
        _load().apply_setting(text)
    assert hot_cold_plan.HOT_MAX_COLD_L0 == before


def test_the_cli_runs_after_the_settings(monkeypatch, capsys):
    patched = _load()
    seen = []
    import twell.cli

    monkeypatch.setattr(hot_cold_plan, "HOT_DENSE_DENSITY", hot_cold_plan.HOT_DENSE_DENSITY)
    monkeypatch.setattr(twell.cli, "main", lambda argv: seen.append((argv, hot_cold_plan.HOT_DENSE_DENSITY)) or 0)
    setting = "twell.ops.hot_cold_plan.HOT_DENSE_DENSITY=0.5"
    assert patched.main(["--set", setting, "--", "tune-dispatch", "--ms", "8"]) == 0
    assert seen == [(["tune-dispatch", "--ms", "8"], 0.5)]


@pytest.mark.parametrize("cli, ok", [
    (["bench", "model", "--preset", "1.5b"], False),  # parts in child processes on CUDA: the settings lost
    (["bench", "model", "--isolation", "process"], False),
    (["bench", "model", "--isolation", "none"], True),
    (["bench", "model", "--isolation=none"], True),
    (["bench", "ffn", "--ms", "8"], True),
])
def test_bench_model_must_run_in_process(cli, ok, monkeypatch):
    patched = _load()
    import twell.cli

    monkeypatch.setattr(twell.cli, "main", lambda argv: 0)
    if ok:
        assert patched.main(["--", *cli]) == 0
    else:
        with pytest.raises(ValueError, match="--isolation none"):
            patched.main(["--", *cli])
