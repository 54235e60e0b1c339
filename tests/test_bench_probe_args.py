"""The shared command line of the GPU probe scripts (``twell.bench.probe``), their build-resource report, and
the ``--shape`` parser of the benchmark CLIs (``twell.bench.shape_arg``): parsing and its errors."""

from __future__ import annotations

import sys

import pytest
import torch

from twell.bench.probe import probe_args, probe_shape_args


def test_probe_shape_args_default_and_given(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["probe", "--device", "cpu"])
    assert probe_shape_args("doc", "2048x5632") == (torch.device("cpu"), False, (2048, 5632))
    monkeypatch.setattr(sys, "argv", ["probe", "--device", "cpu", "--tiny", "--shape", "4096X14336"])
    assert probe_shape_args("doc", "2048x5632") == (torch.device("cpu"), True, (4096, 14336))
    monkeypatch.setattr(sys, "argv", ["probe", "--device", "cpu"])
    assert probe_args("doc") == (torch.device("cpu"), False)


@pytest.mark.parametrize("bad", ["2048", "2048x", "x5632", "2048x5632x2", "0x5632", "2048x-1", "axb"])
def test_probe_shape_args_refuses_a_bad_shape(monkeypatch, capsys, bad):
    monkeypatch.setattr(sys, "argv", ["probe", "--device", "cpu", "--shape", bad])
    with pytest.raises(SystemExit) as exc:
        probe_shape_args("doc", "2048x5632")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --shape: shape must be HIDDENxFFN" in err and repr(bad) in err


def test_build_resources_of_launched_kernels():
    """Registers and spills of the builds a probe launched, read off the JIT cache; nothing where the kernel
    compiled nothing (the interpreter) or the build was there before."""
    from types import SimpleNamespace

    from twell.bench.probe import builds_of, new_build_resources

    assert builds_of(object()) == {} and new_build_resources(object(), {}) == ""
    old = SimpleNamespace(n_regs=64, n_spills=0, metadata=SimpleNamespace(num_warps=4))
    new = SimpleNamespace(n_regs=128, n_spills=8, metadata=SimpleNamespace(num_warps=8))
    kernel = SimpleNamespace(device_caches={0: ({"a": old, "b": new}, None, None, None, None)})
    before = {"0:a": old}
    assert set(builds_of(kernel)) == {"0:a", "0:b"}
    assert new_build_resources(kernel, before) == "128 registers, 8 B spilled, 8 warps"
    assert new_build_resources(kernel, builds_of(kernel)) == ""
