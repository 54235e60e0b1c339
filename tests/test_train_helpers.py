"""Shared pieces of the tests/test_train_*.py files (no tests here): a small stand-in model and a tiny corpus."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from twell.nn import SparseGatedMLP


class StandIn(nn.Module):
    """Embedding -> residual blocks (LayerNorm, previous-token mix, SparseGatedMLP) -> tied LM head."""

    def __init__(self, vocab: int = 256, d: int = 32, f: int = 64, n_layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(n_layers))
        self.mix = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(n_layers))
        self.mlps = nn.ModuleList(SparseGatedMLP(d, f, backend="torch", tile=16) for _ in range(n_layers))
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for norm, mix, mlp in zip(self.norms, self.mix, self.mlps, strict=True):
            prev = F.pad(x, (0, 0, 1, 0))[:, :-1]  # causal: token t sees t-1
            x = x + mix(prev)
            x = x + mlp(norm(x))
        return F.linear(x, self.emb.weight)


def stand_in_fn(spec: object) -> StandIn:
    return StandIn(vocab=getattr(spec, "vocab_size", 256))


def corpus_dir(root: str) -> str:
    """A small deterministic text corpus (~60 KB) written under ``root``."""
    from pathlib import Path

    d = Path(root) / "corpus"
    d.mkdir(parents=True, exist_ok=True)
    words = ["def", "return", "self", "import", "class", "value", "for", "in", "range", "if", "else", "print"]
    g = torch.Generator().manual_seed(0)
    for i in range(6):
        idx = torch.randint(0, len(words), (2000,), generator=g).tolist()
        lines = [" ".join(words[j] for j in idx[k:k + 8]) for k in range(0, len(idx), 8)]
        (d / f"doc{i}.txt").write_text("\n".join(lines) * 3)
    return str(d)
