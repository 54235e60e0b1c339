"""Offline text data: a corpus from local files, a byte-level BPE tokenizer, token blocks and batches.

No download is ever made.  The default corpus is the Python standard library's own source
(``sysconfig.get_paths()["stdlib"]``, ``*.py`` files, ``site-packages`` excluded): it exists on every
machine with Python, and CPython 3.11 ships ~13 K files / ~60 MB of it, far more than a CPU run needs,
so it is capped (``max_bytes``) after sorting the files by relative path, which makes the corpus the same
on every run and machine with the same Python.  Users point :func:`load_corpus` at their own files or
folders instead.

The tokenizer is a byte-level BPE trained with ``tokenizers`` (no unknown tokens, any text round-trips);
on 4 MB of source it trains in a few seconds on 2 CPU cores.  It and the encoded token ids are cached in
``cache_dir`` under a key made of the corpus files' paths, sizes and mtimes, the byte cap and vocab size.

Held-out split: every ``heldout_every``-th document (default 20, i.e. 5 %) goes to the held-out set, so
held-out text is never seen in training, at document granularity (with fewer documents than that, the
last one is held out).  Documents are joined with an
end-of-text token.  Blocks are non-overlapping windows of ``seq_len + 1`` tokens (inputs are the first
``seq_len``, targets the last ``seq_len``).  The batch of step ``s`` is a pure function of ``(seed, s)``
(a fresh permutation per epoch), so a resumed run sees exactly the batches a continuous run would.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "EOT",
    "TokenData",
    "batch_at",
    "default_corpus_files",
    "iterate_batches",
    "load_corpus",
    "make_blocks",
    "prepare_data",
    "train_tokenizer",
]

#: Document separator (also the tokenizer's only special token, id 0).
EOT = "<|endoftext|>"

#: Default corpus cap: 4 MB of text gives ~1.3 M tokens at vocab 4096, ~10x what the CPU demo consumes
#: (400 steps x 16 x 128 tokens ~ 0.8 M with repeats allowed), and trains the tokenizer in ~3 s.
DEFAULT_MAX_BYTES = 4_000_000


def default_corpus_files() -> list[Path]:
    """The standard library's ``*.py`` files, sorted by path relative to the stdlib root, site-packages excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if "site-packages" not in p.relative_to(root).parts and p.is_file()]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _expand(paths: Sequence[str | Path], suffixes: Sequence[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted((f for f in p.rglob("*") if f.is_file() and (not suffixes or f.suffix in suffixes)),
                              key=lambda f: f.relative_to(p).as_posix()))
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"corpus path {p} does not exist")
    return out


def load_corpus(
    paths: Sequence[str | Path] | None = None,
    *,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    suffixes: Sequence[str] = (".py", ".txt", ".md", ".rst"),
) -> tuple[list[str], list[Path]]:
    """Read documents (one per file) in deterministic order until ``max_bytes`` (None: no cap).

    ``paths``: files and/or folders (folders are searched recursively for ``suffixes``); None means the
    standard library (:func:`default_corpus_files`).  Undecodable bytes are replaced.  Returns the
    documents and the files they came from.
    """
    files = default_corpus_files() if paths is None else _expand(paths, suffixes)
    docs: list[str] = []
    used: list[Path] = []
    total = 0
    for f in files:
        text = f.read_bytes().decode("utf-8", errors="replace")
        if not text.strip():
            continue
        if max_bytes is not None and total + len(text) > max_bytes:
            if total == 0:
                text = text[:max_bytes]
            else:
                break
        docs.append(text)
        used.append(f)
        total += len(text)
    if not docs:
        raise ValueError(f"no text found in {paths if paths is not None else 'the standard library'}")
    return docs, used


def train_tokenizer(docs: Sequence[str], vocab_size: int = 4096) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``docs``; id 0 is :data:`EOT`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tok


def make_blocks(ids: np.ndarray, seq_len: int) -> torch.Tensor:
    """Non-overlapping windows of ``seq_len + 1`` tokens from a 1-D id array: ``[n_blocks, seq_len + 1]`` int64.

    Consecutive windows share their boundary token (window i covers ``[i*seq_len, (i+1)*seq_len]``), so
    every token is a target exactly once.
    """
    n = (len(ids) - 1) // seq_len
    if n <= 0:
        raise ValueError(f"{len(ids)} tokens are too few for one block of seq_len={seq_len} (+1)")
    t = torch.from_numpy(np.asarray(ids[: n * seq_len + 1], dtype=np.int64))
    return t.unfold(0, seq_len + 1, seq_len).contiguous()


@dataclass
class TokenData:
    """Tokenized corpus: ``train`` / ``heldout`` blocks ``[n, seq_len + 1]`` and the tokenizer."""

    train: torch.Tensor
    heldout: torch.Tensor
    tokenizer: Any
    vocab_size: int
    seq_len: int
    n_docs: int
    n_bytes: int

    @property
    def train_tokens(self) -> int:
        return int(self.train.shape[0] * self.seq_len)


def _cache_key(files: Sequence[Path], max_bytes: int | None, vocab_size: int, heldout_every: int) -> str:
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    h.update(f"{max_bytes}|{vocab_size}|{heldout_every}|v2".encode())
    return h.hexdigest()[:16]


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "twell" / "data"


def prepare_data(
    paths: Sequence[str | Path] | None = None,
    *,
    seq_len: int = 128,
    vocab_size: int = 4096,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    heldout_every: int = 20,
    cache_dir: str | Path | None = None,
) -> TokenData:
    """Corpus -> tokenizer -> token ids -> train / held-out blocks (see the module docs), cached on disk.

    ``cache_dir=None`` uses ``~/.cache/twell/data``; pass ``False``-y ``""`` to disable caching.
    """
    from tokenizers import Tokenizer

    if heldout_every < 2:
        raise ValueError(f"heldout_every must be >= 2 (one document in heldout_every is held out), got {heldout_every}")
    docs, files = load_corpus(paths, max_bytes=max_bytes)
    cache = None if cache_dir == "" else Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = _cache_key(files, max_bytes, vocab_size, heldout_every)
    tok = None
    ids: dict[str, np.ndarray] = {}
    if cache is not None and (cache / key / "tokenizer.json").exists() and (cache / key / "ids.npz").exists():
        tok = Tokenizer.from_file(str(cache / key / "tokenizer.json"))
        with np.load(cache / key / "ids.npz") as z:
            ids = {"train": z["train"], "heldout": z["heldout"]}
    if tok is None:
        tok = train_tokenizer(docs, vocab_size)
        eot = tok.token_to_id(EOT)
        parts: dict[str, list[np.ndarray]] = {"train": [], "heldout": []}
        n = len(docs)
        for i, enc in enumerate(tok.encode_batch(docs)):
            # Fewer than heldout_every documents: hold out the last one (if there are two or more).
            held = i % heldout_every == heldout_every - 1 or (n < heldout_every and n >= 2 and i == n - 1)
            split = "heldout" if held else "train"
            parts[split].append(np.asarray(enc.ids + [eot], dtype=np.int32))
        ids = {k: np.concatenate(v) if v else np.zeros(0, np.int32) for k, v in parts.items()}
        if cache is not None:
            d = cache / key
            d.mkdir(parents=True, exist_ok=True)
            tok.save(str(d / "tokenizer.json"))
            np.savez(d / "ids.npz", **ids)
            (d / "meta.json").write_text(json.dumps({"n_docs": len(docs), "files": len(files),
                                                     "vocab_size": vocab_size, "max_bytes": max_bytes}))
    return TokenData(
        train=make_blocks(ids["train"], seq_len),
        heldout=make_blocks(ids["heldout"], seq_len),
        tokenizer=tok,
        vocab_size=tok.get_vocab_size(),
        seq_len=seq_len,
        n_docs=len(docs),
        n_bytes=sum(len(d) for d in docs),
    )


def batch_at(blocks: torch.Tensor, step: int, batch_size: int, *, seed: int = 0, rank: int = 0,
             world_size: int = 1) -> torch.Tensor:
    """The ``[batch_size, seq_len + 1]`` slice of this rank of the global batch of ``step``.

    The global batch (``batch_size * world_size`` blocks) is the ``step``-th run of a stream made of one
    seeded permutation of all blocks per epoch; a pure function of its arguments (resume-safe).
    """
    n = blocks.shape[0]
    g = batch_size * world_size
    start = step * g + rank * batch_size
    idx = []
    perms: dict[int, torch.Tensor] = {}
    for pos in range(start, start + batch_size):
        epoch, i = divmod(pos, n)
        if epoch not in perms:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            perms[epoch] = torch.randperm(n, generator=gen)
        idx.append(int(perms[epoch][i]))
    return blocks[torch.tensor(idx)]


def iterate_batches(blocks: torch.Tensor, batch_size: int, *, start_step: int = 0, seed: int = 0, rank: int = 0,
                    world_size: int = 1) -> Iterator[torch.Tensor]:
    """Endless ``batch_at(blocks, step, ...)`` for ``step = start_step, start_step + 1, ...``."""
    step = start_step
    while True:
        yield batch_at(blocks, step, batch_size, seed=seed, rank=rank, world_size=world_size)
        step += 1
