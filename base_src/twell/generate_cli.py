"""``twell generate``: greedy text generation from a local model directory with :class:`GreedyDecoder`.

The model directory holds either a twell model (``config.json`` of model type ``twell_llama`` /
``twell_qwen2``, as ``save_pretrained`` and ``twell train`` checkpoints write it) or a Llama-style
ReLU checkpoint such as the published SparseLM ones (loaded by :func:`twell.models.load_sparselm`).
Prompts are text (``--prompt``, needs a tokenizer: ``--tokenizer``, else the model directory's
``tokenizer.json``) or token ids (``--prompt-ids``).  Each prompt is decoded on its own (batch 1), so
that its tokens/s are its own.  ``--compare`` also runs ``model.generate`` on the same prompt and
prints whether the tokens are identical and both speeds.  Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

_TWELL_TYPES = ("twell_llama", "twell_qwen2")
_DTYPES = {"auto": None, "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="twell generate", description=__doc__.splitlines()[0])
    p.add_argument("model", help="local model directory (config.json and weights)")
    p.add_argument("--prompt", action="append", default=[], help="a text prompt (repeatable)")
    p.add_argument("--prompt-ids", action="append", default=[],
                   help="a prompt as space-separated token ids (repeatable; no tokenizer needed)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json file, or a directory holding one (default: the model directory's)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--eos-token-id", type=int, action="append", default=None,
                   help="stop a sequence at this token (repeatable; default: none, always max-new-tokens)")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=list(_DTYPES), help="auto: bfloat16 on CUDA, float32 else")
    p.add_argument("--policy", default="default", choices=["default", "decode-1"],
                   help="decode-1: the small-batch kernels for one-token calls (CUDA-graphed steps), else "
                        "the default dispatch")
    p.add_argument("--eager", action="store_true", help="no CUDA graph (the step runs eagerly)")
    p.add_argument("--compile", action="store_true", help="the step under torch.compile before it is recorded")
    p.add_argument("--compare", action="store_true", help="also run model.generate and compare tokens and speed")
    return p


def _load_tokenizer(path: Path) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - tokenizers is a declared dependency of the extras
        raise SystemExit("text prompts need the tokenizers package (pip install 'twell[hf]')") from exc
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise SystemExit(f"no tokenizer at {path}: give --tokenizer a tokenizer.json (or its directory), "
                         "or pass --prompt-ids")
    return Tokenizer.from_file(str(file))


def _load_model(path: Path, device: Any, dtype: Any) -> Any:
    import twell.models as tm

    config = path / "config.json"
    if not config.is_file():
        raise SystemExit(f"{path} has no config.json: give a model directory (save_pretrained or a checkpoint)")
    model_type = json.loads(config.read_text()).get("model_type")
    if model_type in _TWELL_TYPES:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    else:
        model = tm.load_sparselm(path, dtype=dtype)
    return model.to(device).eval()


def _prompts(args: argparse.Namespace, tokenizer: Any) -> list[list[int]]:
    out = []
    for text in args.prompt:
        ids = tokenizer.encode(text).ids
        if not ids:
            raise SystemExit(f"prompt {text!r} encodes to no tokens")
        out.append(ids)
    for spec in args.prompt_ids:
        try:
            ids = [int(t) for t in spec.split()]
        except ValueError:
            raise SystemExit(f"--prompt-ids takes space-separated integers, got {spec!r}") from None
        if not ids or min(ids) < 0:
            raise SystemExit(f"--prompt-ids needs at least one token id >= 0, got {spec!r}")
        out.append(ids)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.prompt and not args.prompt_ids:
        raise SystemExit("give at least one --prompt or --prompt-ids")
    if args.max_new_tokens < 1:
        raise SystemExit(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    import torch

    from .bench.model_setup import POLICIES
    from .generation import GreedyDecoder
    from .models import set_dispatch_policy

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    dtype = (torch.bfloat16 if device.type == "cuda" else torch.float32) if args.dtype == "auto" else \
        getattr(torch, _DTYPES[args.dtype])
    model_dir = Path(args.model)
    tokenizer = None
    if args.prompt or args.tokenizer:
        tokenizer = _load_tokenizer(Path(args.tokenizer) if args.tokenizer else model_dir)
    prompts = _prompts(args, tokenizer)
    model = _load_model(model_dir, device, dtype)
    vocab = model.config.vocab_size
    for ids in prompts:
        if max(ids) >= vocab:
            raise SystemExit(f"token id {max(ids)} is outside the model's vocabulary of {vocab}")
    if args.policy != "default":
        set_dispatch_policy(model, POLICIES[args.policy])
    cuda_graph = device.type == "cuda" and not args.eager
    decoder = GreedyDecoder(model, eos_token_id=args.eos_token_id, cuda_graph=cuda_graph, compile=args.compile)

    def timed(fn: Any) -> tuple[torch.Tensor, float]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out, time.perf_counter() - t0

    for ids in prompts:
        x = torch.tensor([ids], dtype=torch.int64, device=device)
        decoder(x, args.max_new_tokens)  # records the step (and compiles it) for this length: untimed
        out, seconds = timed(lambda x=x: decoder(x, args.max_new_tokens))
        new = out[0, len(ids):].tolist()
        text = tokenizer.decode(new) if tokenizer is not None else " ".join(map(str, new))
        print(f"--- prompt ({len(ids)} tokens) -> {len(new)} new tokens, {len(new) / seconds:.1f} tokens/s "
              f"({'CUDA graph' if cuda_graph else 'eager'}{', compiled' if args.compile else ''})")
        print(text)
        if args.compare:
            kw: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "do_sample": False,
                                  "pad_token_id": decoder.pad, "attention_mask": torch.ones_like(x)}
            if args.eos_token_id:
                kw["eos_token_id"] = args.eos_token_id
            else:
                kw["min_new_tokens"] = args.max_new_tokens
            with torch.no_grad():
                model.generate(x, **kw)  # warm-up
                ref, ref_s = timed(lambda x=x, kw=kw: model.generate(x, **kw))
            same = ref.shape == out.shape and bool(torch.equal(ref, out))
            print(f"    model.generate: {(ref.shape[1] - len(ids)) / ref_s:.1f} tokens/s; tokens "
                  f"{'identical' if same else 'DIFFERENT'}")
    return 0
