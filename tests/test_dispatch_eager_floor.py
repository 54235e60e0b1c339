"""``DispatchPolicy.eager_min_tokens``: eager calls below the floor run dense; traced, static-dispatch and recorded
calls, and calls at or above the floor, follow the tables; the floor is validated, stored in policy files and told by
the summary."""

from __future__ import annotations

import pytest
import torch

from twell.nn import DEFAULT_POLICY, DispatchPolicy, SparseGatedMLP, load_policy, save_policy, static_dispatch
from twell.nn.dispatch_file import policy_from_dict, policy_to_dict
from twell.nn.dispatch_summary import inference_summary
from twell.tolerances import REL_TOL, rel_error

SPARSE_EVERYWHERE = {"table": ((0, 1.0),), "shapes": None}


def test_the_default_policy_sets_no_token_floor():
    """The default's floor is in work (``eager_min_flops``, tests/test_dispatch_eager_flops.py), not in tokens."""
    assert DEFAULT_POLICY.eager_min_tokens == 0
    assert DispatchPolicy().eager_min_tokens == 0 and DispatchPolicy().eager_floor_tokens((2048, 5632)) == 0


@pytest.mark.parametrize("floor", [-1, 1.5, True, "64", None])
def test_a_bad_floor_is_refused_by_name(floor):
    with pytest.raises(ValueError, match=r"eager_min_tokens must be an int >= 0 \(0: no floor for eager calls\), got"):
        DispatchPolicy(eager_min_tokens=floor)


def test_eager_calls_below_the_floor_run_dense_and_others_follow_the_table():
    policy = DispatchPolicy(**SPARSE_EVERYWHERE, eager_min_tokens=4096)
    for n in (1, 100, 4095):
        assert not policy.use_sparse(n, 0.005, eager=True)
        assert policy.use_sparse(n, 0.005)  # not eager: the table's answer
    assert policy.use_sparse(4096, 0.005, eager=True) and policy.use_sparse(131072, 0.005, eager=True)
    forced = DispatchPolicy(table=((0, 1.0),), force=True, eager_min_tokens=8)
    assert not forced.use_sparse(4, 0.5, device_type="cpu", eager=True)  # force lifts device and shape limits only
    assert forced.use_sparse(4, 0.5, device_type="cpu") and forced.use_sparse(8, 0.5, device_type="cpu", eager=True)
    assert DispatchPolicy(**SPARSE_EVERYWHERE).use_sparse(1, 0.005, eager=True)  # no floor


def test_the_floor_applies_to_the_small_batch_kernels_too():
    policy = DispatchPolicy(**SPARSE_EVERYWHERE, decode_max_tokens=8, eager_min_tokens=4)
    assert policy.use_decode(2) and not policy.use_decode(2, eager=True)
    assert policy.use_decode(4, eager=True) and policy.use_decode(8, eager=True)


@pytest.mark.parametrize("eager", [1, "yes", None])
def test_eager_must_be_a_bool(eager):
    policy = DispatchPolicy(**SPARSE_EVERYWHERE, eager_min_tokens=4)
    with pytest.raises(TypeError, match="eager must be a bool"):
        policy.use_sparse(2, 0.005, eager=eager)
    with pytest.raises(TypeError, match="eager must be a bool"):
        DispatchPolicy(**SPARSE_EVERYWHERE, decode_max_tokens=8).use_decode(2, eager=eager)


def test_policy_files_keep_the_floor_and_older_files_load_without_one(tmp_path):
    policy = DispatchPolicy(table=((1024, 0.01),), eager_min_tokens=2048)
    assert load_policy(save_policy(policy, tmp_path / "p.json")) == policy
    older = policy_to_dict(policy)
    del older["eager_min_tokens"]  # files written before session 41
    assert policy_from_dict(older).eager_min_tokens == 0
    bad = policy_to_dict(policy)
    bad["eager_min_tokens"] = -5
    with pytest.raises(ValueError, match="p.json: eager_min_tokens must be an int >= 0"):
        policy_from_dict(bad, source="p.json")


def test_the_summary_tells_the_floor():
    hopper = (9, 0)
    assert "eager" not in inference_summary(DEFAULT_POLICY.without_eager_floor(), "cuda", hopper)
    text = inference_summary(DispatchPolicy(eager_min_tokens=4096), "cuda", hopper)
    assert text.endswith("; eager calls of fewer than 4096 tokens (eager_min_tokens) run dense")
    forced = inference_summary(DispatchPolicy(table=((0, 1.0),), force=True, eager_min_tokens=16), "cpu", None)
    assert forced.startswith("forced: ") and forced.endswith("fewer than 16 tokens (eager_min_tokens) run dense")


def _layer(floor: int) -> SparseGatedMLP:
    torch.manual_seed(0)
    policy = DispatchPolicy(table=((0, 1.0),), device_types=("cpu",), shapes=None, eager_min_tokens=floor)
    return SparseGatedMLP(32, 64, policy=policy, dtype=torch.float64).eval()


def _count_sparse_calls(layer: SparseGatedMLP, monkeypatch) -> list[int]:
    calls: list[int] = []
    real = SparseGatedMLP._ffn_sparse

    def spy(self, x, residual=None):
        calls.append(x.shape[0])
        return real(self, x, residual)

    monkeypatch.setattr(SparseGatedMLP, "_ffn_sparse", spy)
    return calls


def test_the_module_runs_eager_calls_below_the_floor_dense(monkeypatch):
    layer = _layer(floor=16)
    dense = layer.to_dense().eval()
    calls = _count_sparse_calls(layer, monkeypatch)
    with torch.no_grad():
        for m in (1, 15, 16, 40):
            x = torch.randn(m, 32, dtype=torch.float64)
            assert rel_error(layer(x), dense(x)) <= REL_TOL[torch.float64]
            assert layer._use_sparse(m, "cpu", eager=True) == (m >= 16)
            assert layer._use_sparse(m, "cpu")  # the same layer, not eager: the table's answer
    assert calls == [16, 40]  # 1 and 15 tokens took the dense path


def test_traced_calls_are_not_eager(monkeypatch):
    """Inside ``static_dispatch`` (what recording a CUDA graph needs) the layer asks the policy without ``eager``, so
    the floor does not apply there."""
    layer = _layer(floor=16)
    asked: list[tuple[int, bool]] = []
    real = DispatchPolicy.use_sparse

    def spy(self, n_tokens, density, **kw):
        asked.append((n_tokens, kw.get("eager", False)))
        return real(self, n_tokens, density, **kw)

    x = torch.randn(4, 32, dtype=torch.float64)
    with torch.no_grad():
        layer(x)  # an eager call sets the l0 estimate
        monkeypatch.setattr(DispatchPolicy, "use_sparse", spy)
        with static_dispatch():
            out = layer(x)
    assert asked == [(4, False)]
    assert rel_error(out, layer.to_dense()(x)) <= REL_TOL[torch.float64]
