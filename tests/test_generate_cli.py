"""``twell generate`` on the CPU: a tiny twell model written by save_pretrained and a tokenizer trained here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="twell generate needs the hf extra")
pytest.importorskip("tokenizers", reason="twell generate needs the hf extra")
from _helpers import TINY_ARCH, TINY_TWELL  # noqa: E402

import twell.models as tm  # noqa: E402
from twell.cli import main as twell_main  # noqa: E402
from twell.generation import greedy_decode  # noqa: E402
from twell.train.data import train_tokenizer  # noqa: E402

VOCAB = 300


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    # a byte-level BPE has 256 byte tokens before any merge: the model gets a vocabulary above that
    model = tm.TwellLlamaForCausalLM(tm.TwellLlamaConfig(**{**TINY_ARCH, "vocab_size": VOCAB}, **TINY_TWELL))
    model.save_pretrained(d)
    docs = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n"] * 20
    train_tokenizer(docs, vocab_size=VOCAB).save(str(d / "tokenizer.json"))
    return d


def test_text_prompt_matches_generate(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = twell_main(["generate", str(model_dir), "--prompt", "def add(a", "--max-new-tokens", "6", "--compare"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "-> 6 new tokens" in out and "eager" in out
    assert "tokens identical" in out and "DIFFERENT" not in out


def test_token_id_prompts_and_the_decoder_agree(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = twell_main(["generate", str(model_dir), "--prompt-ids", "5 9 17", "--prompt-ids", "3",
                     "--max-new-tokens", "4", "--policy", "decode-1"])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0 and len(lines) == 4
    model = tm.TwellLlamaForCausalLM.from_pretrained(model_dir).eval()
    want = greedy_decode(model, torch.tensor([[5, 9, 17]]), 4)[0, 3:].tolist()
    assert lines[1] == " ".join(map(str, want))  # no tokenizer: the new ids are printed


def test_bad_invocations_are_refused(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="at least one --prompt"):
        twell_main(["generate", str(model_dir)])
    with pytest.raises(SystemExit, match="space-separated integers"):
        twell_main(["generate", str(model_dir), "--prompt-ids", "1 x"])
    with pytest.raises(SystemExit, match="outside the model's vocabulary"):
        twell_main(["generate", str(model_dir), "--prompt-ids", "100000"])
    with pytest.raises(SystemExit, match="max-new-tokens must be >= 1"):
        twell_main(["generate", str(model_dir), "--prompt-ids", "1", "--max-new-tokens", "0"])
    with pytest.raises(SystemExit, match="no config.json"):
        twell_main(["generate", str(tmp_path), "--prompt-ids", "1"])
    with pytest.raises(SystemExit, match="no tokenizer"):
        twell_main(["generate", str(model_dir), "--prompt", "hi", "--tokenizer", str(tmp_path)])
