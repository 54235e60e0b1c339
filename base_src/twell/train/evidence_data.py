"""The GPU evidence run's corpus: every installed Python source file of the machine, tokenized to a budget.

:mod:`twell.train.data` reads a capped prefix of the standard library, trains the tokenizer on all of it
and encodes all of it: right for a few MB, too slow for the hundreds of MB of ``.py`` files a GPU
machine's site-packages hold.  Here:

* **Files**: ``*.py`` under the interpreter's stdlib and site-packages roots (``sysconfig``), symlinks
  not followed, files over ``max_file_bytes`` skipped (generated tables, not code), then put in a seeded
  random order (so that the first N MB mix all packages instead of being, say, all of numpy).
* **Split by file**: in that order every ``heldout_every``-th file goes to the held-out set (until it
  holds enough tokens); the rest are training files.  Files with identical bytes are read once (vendored
  copies), so no held-out text also appears verbatim in training.
* **Tokenizer**: byte-level BPE (:func:`twell.train.data.train_tokenizer`) trained on the first
  ``tokenizer_sample_bytes`` of training text only; if the ``tokenizers`` package is missing, raw bytes
  (ids 1..256, 0 is the end-of-text token) so that the run still happens.
* **Time-boxed encoding**: training text is read and encoded (``encode_batch``, all cores) in chunks
  until ``train_tokens`` tokens exist or ``deadline`` (a ``time.perf_counter()`` value) passes; fewer
  tokens than asked means the run repeats data, which the returned stats say.
"""

from __future__ import annotations

import hashlib
import os
import random
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .data import EOT, TokenData, make_blocks, train_tokenizer

__all__ = ["ByteTokenizer", "build_python_corpus", "python_source_files", "python_source_roots"]


def python_source_roots() -> list[Path]:
    """The interpreter's stdlib and site-packages directories that exist, without nested duplicates."""
    paths = sysconfig.get_paths()
    roots: list[Path] = []
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = Path(paths[key]).resolve() if paths.get(key) else None
        if p is not None and p.is_dir() and p not in roots:
            roots.append(p)
    # A root inside another (site-packages inside stdlib) would list its files twice.
    return [r for r in roots if not any(o != r and o in r.parents for o in roots)]


def python_source_files(roots: Sequence[Path], *, max_file_bytes: int = 1 << 20) -> list[tuple[Path, int]]:
    """``(path, size)`` of the ``*.py`` files under ``roots`` (1 byte .. ``max_file_bytes``), sorted by path.

    A ``scandir`` walk that does not follow symlinks (one ``stat`` per file from the directory listing):
    site-packages of a GPU image hold 10^5 files, where ``rglob`` plus ``resolve`` took seconds per 10^4.
    """
    found: dict[str, int] = {}
    stack = [str(r) for r in roots]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:  # permission, vanished
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.name.endswith(".py") and e.is_file(follow_symlinks=False):
                    size = e.stat(follow_symlinks=False).st_size
                    if 0 < size <= max_file_bytes:
                        found[e.path] = size
            except OSError:
                continue
    return [(Path(k), found[k]) for k in sorted(found)]


class ByteTokenizer:
    """Fallback when ``tokenizers`` is missing: one token per UTF-8 byte (ids 1..256), id 0 is EOT."""

    vocab_size = 257

    def encode_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int32) + 1 for t in texts]

    def get_vocab_size(self) -> int:
        return self.vocab_size


def _read_unique(files: Iterator[Path], seen: set[bytes]) -> Iterator[str]:
    """Decoded texts of ``files``, skipping unreadable, blank and already-seen (by content hash) ones."""
    for f in files:
        try:
            raw = f.read_bytes()
        except OSError:
            continue
        digest = hashlib.blake2b(raw, digest_size=16).digest()
        if digest in seen:
            continue
        seen.add(digest)
        text = raw.decode("utf-8", errors="replace")
        if text.strip():
            yield text


def _take(texts: Iterator[str], max_bytes: int) -> list[str]:
    """Next texts from ``texts`` until their total length reaches ``max_bytes`` (at least one if any)."""
    out: list[str] = []
    total = 0
    for t in texts:
        out.append(t)
        total += len(t)
        if total >= max_bytes:
            break
    return out


def build_python_corpus(
    *,
    train_tokens: int,
    heldout_tokens: int,
    seq_len: int,
    vocab_size: int = 16384,
    tokenizer_sample_bytes: int = 24_000_000,
    chunk_bytes: int = 8_000_000,
    heldout_every: int = 20,
    max_file_bytes: int = 1 << 20,
    seed: int = 0,
    deadline: float | None = None,
    roots: Sequence[Path] | None = None,
    log: Callable[[str], None] = print,
) -> tuple[TokenData, dict[str, Any]]:
    """Tokenized train / held-out blocks of the installed Python sources (see the module docs) and stats.

    ``train_tokens`` / ``heldout_tokens``: how many tokens to encode (training stops early at
    ``deadline``; the held-out set is encoded first, so it is complete).  ``roots`` defaults to
    :func:`python_source_roots`.
    """
    t0 = time.perf_counter()
    roots = list(roots) if roots is not None else python_source_roots()
    listed = python_source_files(roots, max_file_bytes=max_file_bytes)
    if not listed:
        raise ValueError(f"no .py files under {[str(r) for r in roots]}")
    total_bytes = sum(size for _, size in listed)
    files = [f for f, _ in listed]
    random.Random(seed).shuffle(files)
    held = set(range(heldout_every - 1, len(files), heldout_every))
    if not held and len(files) >= 2:  # fewer files than heldout_every: hold out the last one
        held = {len(files) - 1}
    held_files = [f for i, f in enumerate(files) if i in held]
    train_files = [f for i, f in enumerate(files) if i not in held]
    log(f"corpus: {len(files)} .py files, {total_bytes / 1e6:.0f} MB under {', '.join(map(str, roots))} "
        f"({time.perf_counter() - t0:.1f} s to list)")

    seen: set[bytes] = set()
    train_texts = _read_unique(iter(train_files), seen)
    t = time.perf_counter()
    sample = _take(train_texts, tokenizer_sample_bytes)
    try:
        tok: Any = train_tokenizer(sample, vocab_size)
        eot = tok.token_to_id(EOT)

        def encode(texts: Sequence[str]) -> list[np.ndarray]:
            return [np.asarray(e.ids, dtype=np.int32) for e in tok.encode_batch(list(texts))]
        kind = "byte-level BPE"
    except ImportError:
        tok, eot = ByteTokenizer(), 0
        encode = tok.encode_ids
        kind = "bytes (the tokenizers package is missing)"
    t_tok = time.perf_counter() - t
    log(f"tokenizer: {kind}, vocab {tok.get_vocab_size()}, trained on {sum(map(len, sample)) / 1e6:.1f} MB "
        f"in {t_tok:.1f} s")

    t = time.perf_counter()
    held_texts = _read_unique(iter(held_files), seen)
    held_ids, held_bytes, held_docs = _encode_until(encode, eot, held_texts, _take(held_texts, chunk_bytes // 4),
                                         heldout_tokens, chunk_bytes, None)
    train_ids, train_bytes, train_docs = _encode_until(encode, eot, train_texts, sample, train_tokens, chunk_bytes,
                                                       deadline)
    t_enc = time.perf_counter() - t
    for split, ids in (("held-out", held_ids), ("training", train_ids)):
        if ids.size <= seq_len:
            raise ValueError(f"the {split} split has {ids.size} tokens, too few for one block of {seq_len} + 1 "
                             f"({len(files)} files under {[str(r) for r in roots]})")
    data = TokenData(
        train=make_blocks(train_ids, seq_len),
        heldout=make_blocks(held_ids, seq_len),
        tokenizer=tok,
        vocab_size=int(tok.get_vocab_size()),
        seq_len=seq_len,
        n_docs=held_docs + train_docs,
        n_bytes=train_bytes + held_bytes,
    )
    stats = {
        "roots": [str(r) for r in roots],
        "files": len(files),
        "files_bytes": total_bytes,
        "tokenizer": kind,
        "vocab_size": data.vocab_size,
        "tokenizer_sample_bytes": sum(map(len, sample)),
        "tokenizer_seconds": t_tok,
        "train_tokens": int(train_ids.size),
        "train_tokens_asked": train_tokens,
        "train_bytes": train_bytes,
        "train_docs": train_docs,
        "heldout_docs": held_docs,
        "heldout_tokens": int(held_ids.size),
        "heldout_bytes": held_bytes,
        "bytes_per_token": train_bytes / max(1, int(train_ids.size)),
        "encode_seconds": t_enc,
        "seconds": time.perf_counter() - t0,
    }
    log(f"tokens: {stats['train_tokens'] / 1e6:.1f} M train ({train_bytes / 1e6:.0f} MB), "
        f"{stats['heldout_tokens'] / 1e6:.2f} M held-out, {stats['bytes_per_token']:.2f} bytes/token, "
        f"encoded in {t_enc:.1f} s")
    return data, stats


def _encode_until(
    encode: Callable[[Sequence[str]], list[np.ndarray]],
    eot: int,
    texts: Iterator[str],
    first: list[str],
    target: int,
    chunk_bytes: int,
    deadline: float | None,
) -> tuple[np.ndarray, int, int]:
    """Encode ``first``, then chunks of ``texts``, each document followed by ``eot``, until ``target`` tokens,
    the end of ``texts`` or ``deadline``; returns the ids (int32), the bytes and the documents encoded."""
    parts: list[np.ndarray] = []
    n_tok = n_bytes = n_docs = 0
    chunk = first
    eot_arr = np.array([eot], dtype=np.int32)
    while chunk:
        for ids in encode(chunk):
            parts += [ids, eot_arr]
            n_tok += len(ids) + 1
        n_bytes += sum(map(len, chunk))
        n_docs += len(chunk)
        if n_tok >= target or (deadline is not None and time.perf_counter() > deadline):
            break
        chunk = _take(texts, chunk_bytes)
    return (np.concatenate(parts) if parts else np.zeros(0, np.int32)), n_bytes, n_docs
