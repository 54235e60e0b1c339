"""Bytes autograd saves per token for a tiny TwellLlama forward, with the transformers RMSNorms and with
``twell.nn.fuse_rms_norms`` forced onto the CPU (where ``F.rms_norm`` is PyTorch's composite version).

    PYTHONPATH=src python scripts/norm_saved_bytes.py
"""

from __future__ import annotations

import torch

from twell.models import TwellLlamaConfig, TwellLlamaForCausalLM
from twell.nn import fuse_rms_norms


def saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves during one training forward."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, labels=ids)
    return sum(seen.values())


def main() -> None:
    torch.manual_seed(0)
    cfg = TwellLlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, twell_backend="torch", l1_coef=0.0)
    model = TwellLlamaForCausalLM(cfg).to(torch.bfloat16).train()
    ids = torch.randint(0, 512, (2, 256))
    before = saved_bytes(model, ids)
    n = fuse_rms_norms(model, devices=("cpu",))
    after = saved_bytes(model, ids)
    tokens = ids.numel()
    print(f"torch {torch.__version__}; d=256 bf16, {n} norms: saved bytes per token: transformers norms "
          f"{before / tokens:.0f}, F.rms_norm {after / tokens:.0f} ({(after - before) / tokens / n:+.0f} per norm)")


if __name__ == "__main__":
    main()
