"""The shared command line of the GPU probe scripts (``twell.bench.probe``) and the ``--shape`` parser of the
benchmark CLIs (``twell.bench.shape_arg``): parsing and its errors."""

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
