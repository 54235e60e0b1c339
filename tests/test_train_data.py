from __future__ import annotations

import torch
from test_train_helpers import corpus_dir

from twell.train.data import (
    EOT,
    batch_at,
    default_corpus_files,
    iterate_batches,
    load_corpus,
    make_blocks,
    prepare_data,
)


def test_default_corpus_is_stdlib_sorted_and_capped() -> None:
    files = default_corpus_files()
    assert len(files) > 100 and all(f.suffix == ".py" for f in files[:50])
    assert all("site-packages" not in f.parts for f in files)
    docs, used = load_corpus(max_bytes=100_000)
    assert sum(map(len, docs)) <= 100_000 and used == files[: len(used)]


def test_tokenizer_and_batches_are_deterministic(tmp_path) -> None:
    corpus = corpus_dir(str(tmp_path))
    a = prepare_data([corpus], seq_len=16, vocab_size=300, cache_dir=str(tmp_path / "c1"), heldout_every=3)
    b = prepare_data([corpus], seq_len=16, vocab_size=300, cache_dir="", heldout_every=3)  # no cache: retrain
    c = prepare_data([corpus], seq_len=16, vocab_size=300, cache_dir=str(tmp_path / "c1"), heldout_every=3)  # hit
    assert torch.equal(a.train, b.train) and torch.equal(a.heldout, b.heldout) and torch.equal(a.train, c.train)
    assert a.train.shape[1] == 17 and a.heldout.shape[0] > 0
    assert a.tokenizer.token_to_id(EOT) == 0
    text = "def value(self):\n    return 1"
    assert a.tokenizer.decode(a.tokenizer.encode(text).ids) == text
    b1 = batch_at(a.train, 5, 4, seed=1)
    assert torch.equal(b1, batch_at(a.train, 5, 4, seed=1)) and not torch.equal(b1, batch_at(a.train, 5, 4, seed=2))
    it = iterate_batches(a.train, 4, start_step=4, seed=1)
    next(it)
    assert torch.equal(next(it), b1)
    # ranks split the global batch
    g = torch.cat([batch_at(a.train, 2, 2, seed=0, rank=r, world_size=2) for r in range(2)])
    assert torch.equal(g, batch_at(a.train, 2, 4, seed=0))


def test_make_blocks_cover_every_target_once() -> None:
    import numpy as np

    blocks = make_blocks(np.arange(11), 3)
    assert blocks.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
