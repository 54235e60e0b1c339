"""The shipped dispatch tables hold on Hopper only (``DispatchPolicy.capabilities``): a CUDA device of another compute
capability runs every layer dense by default, in inference and in training, until its own table is measured."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from twell.nn import DEFAULT_POLICY, DispatchPolicy, SparseGatedMLP, train_dispatch
from twell.nn import mlp as mlp_module
from twell.nn.dispatch import HOPPER
from twell.nn.dispatch_file import load_policy, policy_from_dict, policy_to_dict, save_policy
from twell.nn.train_dispatch import DEFAULT_TRAIN_POLICY, TrainDispatchPolicy, TrainSwitch
from twell.ops._runtime import cuda_capability

SHAPE = (2048, 5632)
A100, ADA, H200, BLACKWELL = (8, 0), (8, 9), (9, 0), (10, 0)


def test_default_policy_runs_its_tables_on_hopper_only():
    """16,384 tokens at 0.5 % and 131,072 at 1 %: sparse in the 2048 x 5632 table, on sm_90 alone."""
    assert DEFAULT_POLICY.capabilities == HOPPER == ((9, 0),)
    for m, density in ((16384, 0.005), (131072, 0.01)):
        assert DEFAULT_POLICY.use_sparse(m, density, shape=SHAPE, capability=H200)
        for other in (A100, ADA, BLACKWELL):
            assert not DEFAULT_POLICY.use_sparse(m, density, shape=SHAPE, capability=other)
        # a caller that does not know the capability is not held to it (the tables as before)
        assert DEFAULT_POLICY.use_sparse(m, density, shape=SHAPE)
        assert not DEFAULT_POLICY.use_sparse(m, density, shape=SHAPE, device_type="cpu", capability=None)


def test_graphed_decode_follows_the_same_rule():
    graphed = dataclasses.replace(DEFAULT_POLICY, decode_graphed=True)
    assert graphed.capabilities == HOPPER
    assert graphed.use_decode(2, density=0.005, shape=SHAPE, capability=H200)
    assert not graphed.use_decode(2, density=0.005, shape=SHAPE, capability=A100)
    eager = DispatchPolicy(decode_max_tokens=1, capabilities=HOPPER, shapes=None)
    assert eager.use_decode(1, shape=SHAPE, capability=H200) and not eager.use_decode(1, shape=SHAPE, capability=ADA)


def test_force_and_an_open_policy_ignore_the_capability():
    assert DispatchPolicy.always_sparse().use_sparse(16, 0.5, capability=A100)
    assert DispatchPolicy(table=((0, 1.0),), shapes=None).use_sparse(16, 0.5, capability=A100)
    assert DispatchPolicy(table=((0, 1.0),), shapes=None, capabilities=[[8, 0]]).capabilities == (A100,)
    assert DispatchPolicy(table=((0, 1.0),), shapes=None, capabilities=[[8, 0]]).use_sparse(16, 0.5, capability=A100)
    assert not DispatchPolicy(table=((0, 1.0),), shapes=None, capabilities=[[8, 0]]).use_sparse(16, 0.5,
                                                                                               capability=H200)


@pytest.mark.parametrize("bad", ["9.0", 9, ((9,),), ((9, 0, 1),), ((True, 0),), ((9.0, 0),), (("9", "0"),)])
def test_bad_capabilities_are_refused_by_name(bad):
    with pytest.raises(TypeError, match="capabilities must be None or \\(major, minor\\) int pairs"):
        DispatchPolicy(capabilities=bad)
    with pytest.raises(TypeError, match="capabilities must be None"):
        TrainDispatchPolicy(capabilities=bad)


def test_policy_files_keep_the_capabilities(tmp_path):
    assert load_policy(save_policy(DEFAULT_POLICY, tmp_path / "default.json")) == DEFAULT_POLICY
    assert policy_to_dict(DEFAULT_POLICY)["capabilities"] == [[9, 0]]
    old = policy_to_dict(DispatchPolicy(capabilities=HOPPER))
    del old["capabilities"]  # files written before session 37: their tables held on every CUDA device
    assert policy_from_dict(old).capabilities is None
    bad = {**policy_to_dict(DEFAULT_POLICY), "capabilities": [[9]]}
    with pytest.raises(TypeError, match="p.json: capabilities must be None"):
        policy_from_dict(bad, source="p.json")


def _layer(capability, monkeypatch) -> SparseGatedMLP:
    monkeypatch.setattr(mlp_module, "cuda_capability", lambda device: capability if device.type == "cuda" else None)
    policy = DispatchPolicy(table=((0, 1.0),), shapes=None, capabilities=HOPPER)
    return SparseGatedMLP(32, 64, policy=policy).eval()


def test_the_layer_asks_its_device_s_capability(monkeypatch):
    """A layer on an sm_80 device runs dense where the same layer on sm_90 runs sparse; the CPU follows
    ``device_types`` as before; a device given as its type string means that type's current device."""
    assert _layer(H200, monkeypatch)._path(8, torch.device("cuda", 0)) == "sparse"
    assert _layer(H200, monkeypatch)._path(8, "cuda") == "sparse"
    on_a100 = _layer(A100, monkeypatch)
    assert on_a100._path(8, torch.device("cuda", 0)) == "dense" and on_a100._path(8, "cuda") == "dense"
    assert not on_a100._use_sparse(8, "cuda")
    assert on_a100._path(8, "cpu") == "dense"  # device_types ("cuda",)


def test_cuda_capability_off_cuda_is_none():
    assert cuda_capability(torch.device("cpu")) is None
    if not torch.cuda.is_available():  # a "cuda" device named where there is none
        assert cuda_capability(torch.device("cuda")) is None
    else:
        assert cuda_capability(torch.device("cuda")) == torch.cuda.get_device_capability()


def test_training_default_holds_to_hopper(monkeypatch):
    kw = {"device_type": "cuda", "shape": SHAPE, "dtype": torch.bfloat16}
    assert DEFAULT_TRAIN_POLICY.capabilities == HOPPER
    assert DEFAULT_TRAIN_POLICY.may_use_sparse(**kw, capability=H200)
    assert not DEFAULT_TRAIN_POLICY.may_use_sparse(**kw, capability=A100)
    assert DEFAULT_TRAIN_POLICY.use_sparse(16384, 0.005, **kw, capability=H200)
    assert not DEFAULT_TRAIN_POLICY.use_sparse(16384, 0.005, **kw, capability=A100)
    assert TrainDispatchPolicy().may_use_sparse(**kw, capability=A100)  # built by hand: no capability named
    # the switch reads the device's capability: on sm_80 it never reads l0 and answers dense
    monkeypatch.setattr(train_dispatch, "cuda_capability", lambda device: A100)
    monkeypatch.setattr(train_dispatch, "triton_available", lambda: True)
    switch = TrainSwitch()
    args = {"device": torch.device("cuda", 0), "shape": SHAPE, "dtype": torch.bfloat16}
    assert not switch.choose(DEFAULT_TRAIN_POLICY, 16384, **args, last_l0=torch.tensor(28.0), refresh_every=1)
    assert switch.host_reads == 0 and switch.last_sparse is False
    assert not switch.traced_choice(DEFAULT_TRAIN_POLICY, 16384, **args)
    monkeypatch.setattr(train_dispatch, "cuda_capability", lambda device: H200)
    assert switch.choose(DEFAULT_TRAIN_POLICY, 16384, **args, last_l0=torch.tensor(28.0), refresh_every=1)
    assert switch.host_reads == 1


@pytest.mark.gpu
def test_gpu_capability_is_a_constant_of_a_compiled_graph():
    """On the GPU machine: the device's capability as torch reports it, read once when torch.compile traces (no
    graph break); the default policy's tables apply there exactly when it is a Hopper."""
    want = torch.cuda.get_device_capability()
    assert cuda_capability(torch.device("cuda")) == want == cuda_capability(torch.device("cuda", 0))

    def step(x):
        return x * 2 if cuda_capability(x.device) == want else x + 1

    torch._dynamo.reset()
    x = torch.ones(8, device="cuda")
    assert torch.equal(torch.compile(step, fullgraph=True)(x), x * 2)
    assert DEFAULT_POLICY.on_measured_device("cuda", want) == (want in HOPPER)
