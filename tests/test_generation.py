"""twell.generation: greedy decoding with a static cache (CUDA-graph step on the GPU) against ``generate``.

Tiny models (hidden 64, 2 layers, vocab 128) on the CPU, where the step runs eagerly; the GPU test
records the step in a CUDA graph and compares it with ``generate`` and with the eager loop.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="twell.generation needs the hf extra")
from _helpers import TINY_ARCH, TINY_TWELL  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import twell.models as tm  # noqa: E402
from twell.generation import GreedyDecoder, greedy_decode  # noqa: E402
from twell.nn import DispatchPolicy, SparseGatedMLP, static_dispatch  # noqa: E402
from twell.tolerances import REL_TOL_FP64_REORDER  # noqa: E402

ARCH, TWELL = TINY_ARCH, TINY_TWELL


def _model(family: str = "llama", dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    cfg_cls, lm_cls = {"llama": (tm.TwellLlamaConfig, tm.TwellLlamaForCausalLM),
                       "qwen2": (tm.TwellQwen2Config, tm.TwellQwen2ForCausalLM)}[family]
    return lm_cls(cfg_cls(**ARCH, **TWELL)).to(device=device, dtype=dtype).eval()


def _ids(batch: int, seq: int, seed: int = 1, device: str = "cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, ARCH["vocab_size"], (batch, seq), generator=gen).to(device)


def _generate(model: torch.nn.Module, ids: torch.Tensor, n: int, **kw: object) -> torch.Tensor:
    # An explicit all-ones mask: without one, generate masks prompt tokens equal to pad_token_id.
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                              use_cache=True, **kw)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize(("batch", "prompt", "new"), [(1, 5, 9), (3, 4, 6), (2, 1, 1)])
def test_matches_generate(family: str, batch: int, prompt: int, new: int) -> None:
    model = _model(family)
    ids = _ids(batch, prompt)
    got = greedy_decode(model, ids, new)
    assert got.shape == (batch, prompt + new)
    assert torch.equal(got, _generate(model, ids, new, min_new_tokens=new, pad_token_id=0))


def test_plain_transformers_model_and_sparse_path_forced() -> None:
    """The dense baseline decodes through the same loop; forced sparse layers give the same tokens."""
    model = _model("llama", torch.float64)
    dense = LlamaForCausalLM(LlamaConfig(**ARCH, hidden_act="relu")).to(torch.float64).eval()
    dense.load_state_dict(model.state_dict())
    tm.set_dispatch_policy(model, DispatchPolicy.always_sparse())
    ids = _ids(2, 6, seed=3)
    got, want = greedy_decode(model, ids, 7), greedy_decode(dense, ids, 7)
    assert torch.equal(got, want)
    assert torch.equal(want, _generate(dense, ids, 7, min_new_tokens=7, pad_token_id=0))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_left_padded_batch_matches_generate(family: str) -> None:
    """Prompts of different lengths, left-padded with their attention mask, as generate takes them."""
    model = _model(family)
    ids = _ids(3, 6, seed=8)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a 3-token prompt
    mask[2, :1] = 0  # a 5-token prompt
    ids = ids.masked_fill(mask == 0, 0)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=7, min_new_tokens=7, do_sample=False,
                              pad_token_id=0)
    dec = GreedyDecoder(model)
    got = dec(ids, 7, mask)
    assert torch.equal(got, want)
    assert torch.equal(dec(ids, 7, mask), want)  # the kept recording, its buffers reset
    assert torch.equal(dec(ids, 7), greedy_decode(model, ids, 7))  # unpadded: a separate recording
    # each padded row decodes as its prompt alone would
    alone = greedy_decode(model, ids[:1, 3:], 7)
    assert torch.equal(got[0, 6:], alone[0, 3:])
    assert torch.equal(greedy_decode(model, ids, 7, attention_mask=torch.ones_like(ids)), dec(ids, 7))


def test_attention_mask_is_checked() -> None:
    model = _model()
    ids = _ids(2, 4)
    with pytest.raises(ValueError, match="left-padded"):
        greedy_decode(model, ids, 2, attention_mask=torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="without any token"):
        greedy_decode(model, ids, 2, attention_mask=torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="0 \\(padding\\) and 1 \\(token\\) only"):
        greedy_decode(model, ids, 2, attention_mask=torch.full((2, 4), 2))
    with pytest.raises(ValueError, match="shape"):
        greedy_decode(model, ids, 2, attention_mask=torch.ones(2, 5))


def test_end_of_sequence_matches_generate() -> None:
    model = _model()
    ids = _ids(3, 4, seed=5)
    free = greedy_decode(model, ids, 10)
    # Make the second sequence's third generated token the end token: generate pads it afterwards and
    # stops when every sequence has finished.
    eos = int(free[1, 4 + 2])
    got = greedy_decode(model, ids, 10, eos_token_id=eos, pad_token_id=7)
    want = _generate(model, ids, 10, eos_token_id=eos, pad_token_id=7)
    assert torch.equal(got, want)
    assert (got[1, 4 + 3:] == 7).all()
    # Every sequence finishing early: the output is cut where the last one ended, as generate's is.
    firsts = [int(t) for t in free[:, 4]]
    got = greedy_decode(model, ids, 10, eos_token_id=firsts, pad_token_id=0)
    want = _generate(model, ids, 10, eos_token_id=firsts, pad_token_id=0)
    assert got.shape == want.shape == (3, 5) and torch.equal(got, want)


def test_decoder_reuses_its_recording_and_tracks_module_swaps() -> None:
    model = _model()
    dec = GreedyDecoder(model, max_graphs=2)
    a, b = _ids(2, 5, seed=1), _ids(2, 5, seed=2)
    first = dec(a, 6)
    assert len(dec._recorded) == 1
    assert torch.equal(dec(b, 6), greedy_decode(model, b, 6))  # same shapes: the recording is reused
    assert torch.equal(dec(a, 6), first)
    assert len(dec._recorded) == 1
    dec(_ids(1, 5), 6)  # another batch size: a second recording
    dec(_ids(2, 3), 4)  # a third: the least recently used one is dropped
    assert len(dec._recorded) == 2
    # Swapping an MLP for another module changes the key: a new recording, not a stale replay.
    layer = model.model.layers[0]
    old = layer.mlp
    layer.mlp = SparseGatedMLP.from_weights(old.gate_proj.weight.detach().clone(), old.up_proj.weight.detach().clone(),
                                            old.down_proj.weight.detach().clone(), backend="torch", tile=32).eval()
    assert torch.equal(dec(a, 6), first)
    assert len(dec._recorded) == 2 and dec._key(2, 11, False) in dec._recorded
    dec.clear()
    assert not dec._recorded


@pytest.mark.parametrize("policy", ["default", "always-sparse"])
def test_compiled_step_matches_generate(policy: str) -> None:
    """compile=<backend>: the step under torch.compile (aot_eager here: the traced graph run eagerly;
    inductor on the GPU), the sparse layers on their traced path; the same tokens as generate."""
    torch._dynamo.reset()
    model = _model("llama", torch.float64)
    if policy == "always-sparse":
        tm.set_dispatch_policy(model, DispatchPolicy.always_sparse())
    ids = _ids(2, 5, seed=4)
    dec = GreedyDecoder(model, compile="aot_eager")
    assert dec.compile_backend == "aot_eager"
    got = dec(ids, 6)
    assert torch.equal(got, _generate(model, ids, 6, min_new_tokens=6, pad_token_id=0))
    assert torch.equal(dec(ids, 6), got)
    assert GreedyDecoder(model, compile=True).compile_backend == "inductor"
    with pytest.raises(ValueError, match="compile must be False, True or a torch.compile backend name"):
        GreedyDecoder(model, compile="")


def test_a_recording_is_redone_when_the_prompt_moves_a_kernel_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recorded step bakes in each sparse layer's kernel choice.  A layer's first call has no l0
    estimate (density taken as 1: dense); the prompt's forward measures it, the choice at the decode
    batch size flips to sparse, and the decoder records the step again.  Simulated on the CPU: the
    recording is the eager step, with the decoder's graph bookkeeping on."""
    model = _model()
    tm.set_dispatch_policy(model, DispatchPolicy(table=((1, 0.9),), force=True, shapes=None))
    builds: list[tuple[str, ...]] = []
    original = GreedyDecoder._build

    def build(self: GreedyDecoder, batch: int, length: int, device: torch.device, padded: bool):  # noqa: ANN202
        self.cuda_graph = False  # the CPU cannot record: build the eager step, keep the graph rule below
        try:
            rec = original(self, batch, length, device, padded)
        finally:
            self.cuda_graph = True
        if self is dec:
            builds.append(rec.decisions)
        return rec

    monkeypatch.setattr(GreedyDecoder, "_build", build)
    dec = GreedyDecoder(model)
    dec.cuda_graph = True
    ids = _ids(2, 5)
    got = dec(ids, 4)
    assert builds == [("dense", "dense"), ("sparse", "sparse")]
    assert torch.equal(got, greedy_decode(model, ids, 4))
    dec(ids, 4)  # the estimates now hold: the kept recording is replayed
    assert len(builds) == 2


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("padded", [False, True], ids=["full", "left-padded"])
def test_step_has_no_host_synchronisation_or_data_dependent_shape(padded: bool) -> None:
    """What recording the step in a CUDA graph needs, checked on the CPU: under static_dispatch the step
    (the sparse layers forced onto their sparse path) reads nothing back to the host."""
    model = _model()
    tm.set_dispatch_policy(model, DispatchPolicy.always_sparse())
    dec = GreedyDecoder(model, eos_token_id=[3, 5], max_graphs=1)
    ids = _ids(2, 4)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]) if padded else None
    dec(ids, 3, mask)  # builds the recording (eager on the CPU) and refreshes every layer's estimate
    (rec,) = dec._recorded.values()
    assert (rec.mask is not None) == padded
    with torch.no_grad():
        dec._prefill(rec, ids, mask, torch.device("cpu"))
    mlp = model.model.layers[0].mlp
    calls_before = mlp._infer_calls
    with torch.no_grad(), static_dispatch(), _Recorder() as recorder:
        rec.run()
    assert mlp._infer_calls == calls_before  # the static path counts nothing
    banned = ("_local_scalar_dense", "aten.item", "aten.nonzero", "aten.is_nonzero", "masked_select")
    found = [op for op in recorder.ops if any(b in op for b in banned)]
    assert not found, found
    assert int(rec.pos) == 5


def test_static_dispatch_reads_the_cached_unit_major_down_only_when_asked() -> None:
    """Inside ``static_dispatch(unit_major_down=True)`` a decode call reads the layer's cached Wd^T copy
    (here replaced by zeros, so the FFN's output is zero); otherwise the weight itself."""
    model = _model("llama", torch.float64)
    tm.set_dispatch_policy(model, DispatchPolicy(decode_max_tokens=1, force=True))
    mlp = model.model.layers[0].mlp
    x = torch.randn(1, 1, ARCH["hidden_size"], dtype=torch.float64)
    with torch.no_grad():
        want = mlp(x)
        mlp.w_down_unit_major()
        mlp._wd_unit_major = torch.zeros_like(mlp._wd_unit_major)
        with static_dispatch():
            view = mlp(x)
        torch.testing.assert_close(view, want, rtol=REL_TOL_FP64_REORDER, atol=0.0)  # float64: summation order only
        with static_dispatch(unit_major_down=True):
            assert torch.count_nonzero(mlp(x)) == 0
        mlp._wd_unit_major = None  # none cached: the weight's view
        with static_dispatch(unit_major_down=True):
            assert torch.equal(mlp(x), view)
    assert bool((want != 0).any())


def test_compiled_decoder_sees_an_in_place_weight_update() -> None:
    """The compiled step reads each sparse layer's unit-major Wd^T unchecked; the decoder refreshes those
    copies before every call, so an in-place update of the weights changes its tokens as it changes
    ``generate``'s."""
    model = _model("llama", torch.float64)
    tm.set_dispatch_policy(model, DispatchPolicy(decode_max_tokens=1, force=True))
    dec = GreedyDecoder(model, compile="eager")
    ids = _ids(1, 5, seed=4)
    # generate's one-token eager calls build the copies (the prompt's 5 tokens take the dense path)
    before = dec(ids, 6)
    assert torch.equal(_generate(model, ids, 6, min_new_tokens=6, pad_token_id=0), before)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(-3.0)
    got = dec(ids, 6)  # before generate's eager calls would rebuild the copies themselves
    want = _generate(model, ids, 6, min_new_tokens=6, pad_token_id=0)
    assert not torch.equal(want, before)  # the update changes the tokens
    assert torch.equal(got, want)


def test_bad_inputs() -> None:
    model = _model()
    with pytest.raises(TypeError, match="int64 or int32"):
        greedy_decode(model, _ids(1, 3).float(), 2)
    with pytest.raises(ValueError, match=r"shape \[batch >= 1, prompt_len >= 1\]"):
        greedy_decode(model, _ids(1, 3)[0], 2)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0"):
        greedy_decode(model, _ids(1, 3), -1)
    with pytest.raises(ValueError, match="eos_token_id"):
        greedy_decode(model, _ids(1, 3), 2, eos_token_id=[])
    with pytest.raises(ValueError, match="pad_token_id"):
        greedy_decode(model, _ids(1, 3), 2, pad_token_id=-1)
    with pytest.raises(ValueError, match="needs a model on a CUDA device"):
        GreedyDecoder(model, cuda_graph=True)
    with pytest.raises(TypeError, match="Hugging Face causal LM"):
        GreedyDecoder(torch.nn.Linear(2, 2))
    model.train()
    with pytest.raises(RuntimeError, match="eval mode"):
        greedy_decode(model, _ids(1, 3), 2)
    assert torch.equal(greedy_decode(model.eval(), _ids(1, 3), 0), _ids(1, 3))


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["default", "decode-1", "always-sparse"])
def test_gpu_graphed_step_matches_generate_and_the_eager_loop(policy: str) -> None:
    model = _model("llama", torch.float32, "cuda")
    for m in model.modules():
        if isinstance(m, SparseGatedMLP):
            m.backend = "auto"
    policies = {"default": DispatchPolicy(), "always-sparse": DispatchPolicy.always_sparse(),
                "decode-1": DispatchPolicy(decode_max_tokens=1, force=True)}
    tm.set_dispatch_policy(model, policies[policy])
    for batch in (1, 4):
        ids = _ids(batch, 6, device="cuda")
        graphed = GreedyDecoder(model)
        assert graphed.cuda_graph
        got = graphed(ids, 12)
        assert torch.equal(got, greedy_decode(model, ids, 12, cuda_graph=False))
        assert torch.equal(got, _generate(model, ids, 12, min_new_tokens=12, pad_token_id=0))
        assert torch.equal(graphed(ids, 12), got)  # replayed from the kept recording


@pytest.mark.gpu
def test_gpu_compiled_and_graphed_step_matches_generate() -> None:
    torch._dynamo.reset()
    model = _model("llama", torch.float32, "cuda")
    for m in model.modules():
        if isinstance(m, SparseGatedMLP):
            m.backend = "auto"
    tm.set_dispatch_policy(model, DispatchPolicy(decode_max_tokens=1, force=True))
    ids = _ids(1, 6, device="cuda")
    got = GreedyDecoder(model, compile=True)(ids, 10)
    assert torch.equal(got, _generate(model, ids, 10, min_new_tokens=10, pad_token_id=0))


@pytest.mark.gpu
def test_gpu_graphed_left_padded_batch_matches_generate() -> None:
    model = _model("llama", torch.float32, "cuda")
    ids = _ids(3, 6, seed=8, device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    ids = ids.masked_fill(mask == 0, 0)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=9, min_new_tokens=9, do_sample=False,
                              pad_token_id=0)
    dec = GreedyDecoder(model)
    assert torch.equal(dec(ids, 9, mask), want)
    assert torch.equal(dec(ids, 9, mask), want)


def test_small_batch_kernels_lift_the_policy_for_the_call_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``small_batch_kernels``: the batch-1 step takes the small-batch path during the call (counted at
    SparseGatedMLP's decode branch), the layers' policies are theirs again afterwards, and the tokens
    are those of the plain loop.  Off by default where the step is not graphed (the CPU)."""
    model = _model()
    policy = DispatchPolicy(table=(), force=True, shapes=None)  # always dense, decode_max_tokens 0
    tm.set_dispatch_policy(model, policy)
    layers = [m for m in model.modules() if isinstance(m, SparseGatedMLP)]
    paths = _spy_paths(monkeypatch)
    ids = _ids(1, 4)
    plain = greedy_decode(model, ids, 5)
    assert GreedyDecoder(model).small_batch_kernels is False and "decode" not in paths
    paths.clear()
    dec = GreedyDecoder(model, small_batch_kernels=True)
    got = dec(ids, 5)
    assert "decode" in paths
    assert all(m.policy is policy for m in layers)  # restored
    assert torch.equal(got, plain)
    lifted = dec._graphed_policies[policy]
    assert lifted.decode_max_tokens == 1 and lifted.decode_graphed and lifted.table == policy.table
    dec(ids, 5)
    assert dec._graphed_policies[policy] is lifted  # one lifted object per policy across calls
    # the older name of the option
    assert GreedyDecoder(model, one_token_kernels=True).small_batch_kernels is True
    assert GreedyDecoder(model, one_token_kernels=True).one_token_kernels is True
    with pytest.raises(TypeError, match="one_token_kernels"):
        GreedyDecoder(model, one_token_kernels=1)
    with pytest.raises(TypeError, match="small_batch_kernels"):
        GreedyDecoder(model, small_batch_kernels="yes")
    with pytest.raises(ValueError, match="disagree"):
        GreedyDecoder(model, small_batch_kernels=True, one_token_kernels=False)


def _spy_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths SparseGatedMLP._path answers from now on, in call order."""
    paths: list[str] = []
    original = SparseGatedMLP._path

    def path(self: SparseGatedMLP, n_tokens: int, device_type: str, eager: bool = False) -> str:
        chosen = original(self, n_tokens, device_type, eager)
        paths.append(chosen)
        return chosen

    monkeypatch.setattr(SparseGatedMLP, "_path", path)
    return paths


@pytest.mark.parametrize(("limit", "want"), [(1.0, "decode"), (0.0, "dense")])
def test_decode_tables_pick_the_batch_step_by_density(monkeypatch: pytest.MonkeyPatch, limit: float,
                                                       want: str) -> None:
    """Under ``small_batch_kernels`` calls of 2-64 tokens follow the decode table of the layers' shape: the
    small-batch path where the layer's density is within the row's limit, dense above it (every layer's density
    here is > 0, so limit 0 is dense); the tokens are the plain loop's either way."""
    model = _model()
    layer = next(m for m in model.modules() if isinstance(m, SparseGatedMLP))
    shape = (layer.hidden_size, layer.intermediate_size)
    policy = DispatchPolicy(table=(), force=True, shapes=None, decode_tables=((shape, ((1, 1.0), (2, limit))),))
    tm.set_dispatch_policy(model, policy)
    ids = _ids(3, 4)
    plain = greedy_decode(model, ids, 4, small_batch_kernels=False)
    paths = _spy_paths(monkeypatch)
    got = GreedyDecoder(model, small_batch_kernels=True)(ids, 4)
    assert paths and set(paths) == {want}  # the eager prompt (12 tokens) and the 3-token steps alike
    assert torch.equal(got, plain)
