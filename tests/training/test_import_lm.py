"""`training import`: a GGUF file (4-bit weights, byte-level BPE) or an HF directory becomes an HF model
directory that loads, tokenizes as the source does and generates; nothing needs the real download."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from tests.tiny_models import LLAMA_SPECIALS, llama_bpe, tiny_llama
from tests.training.tiny_gguf import write_tiny_gguf
from training.cli import app
from training.import_lm import IMPORT_REPORT, import_causal_lm

TEXTS = ["I loved this film in 1950, it was wonderful.", "naïve café — 日本語 🙂\n\n  two  spaces", "Who?"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    """A tiny GGUF file and the model and tokenizer it was written from (the model holding the weights
    as a reader dequantizes them)."""
    tokenizer = llama_bpe()
    model = tiny_llama(len(tokenizer), std=0.2)
    path = tmp_path_factory.mktemp("gguf") / "tiny.Q4_1.gguf"
    write_tiny_gguf(model, tokenizer, path)
    return path, model, tokenizer


@pytest.fixture(scope="module")
def imported(source: tuple[Path, Any, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "teacher"
    import_causal_lm(source[0], out)
    return out


def test_a_gguf_file_becomes_a_directory_that_loads_and_generates_as_the_source(
    source: tuple[Path, Any, Any], imported: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, reference, reference_tokenizer = source
    model = AutoModelForCausalLM.from_pretrained(imported).eval()
    tokenizer = AutoTokenizer.from_pretrained(imported)
    assert model.dtype == torch.float32 and model.config.num_key_value_heads == 2
    for text in TEXTS:
        ids = reference_tokenizer(text)["input_ids"]
        assert tokenizer(text)["input_ids"] == ids  # no BOS added, digits split as the source splits them
        assert tokenizer.decode(ids) == text
        with torch.no_grad():
            got, expected = model(torch.tensor([ids])).logits, reference(torch.tensor([ids])).logits
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    prompt = torch.tensor([reference_tokenizer("Acme was founded by")["input_ids"]])
    settings = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 2}
    assert torch.equal(model.generate(prompt, **settings), reference.generate(prompt, **settings))


def test_the_special_tokens_generation_config_and_chat_template_are_the_files_own(imported: Path) -> None:
    """transformers' own GGUF tokenizer takes the EOS from the BOS id and prepends a BOS; the file says
    <|im_end|> (2) ends a sequence and pads, <|im_start|> (1) begins one, and no BOS is added."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(imported)
    assert (tokenizer.unk_token, tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        *LLAMA_SPECIALS,
        LLAMA_SPECIALS[2],
    )
    assert tokenizer("<|im_start|>user")["input_ids"][0] == 1  # a special token is never split
    generation = GenerationConfig.from_pretrained(imported)
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == (1, 2, 2)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert (imported / "tokenizer.json").is_file() and (imported / "model.safetensors").is_file()


def test_the_import_report_says_where_the_model_came_from(
    source: tuple[Path, Any, Any], imported: Path
) -> None:
    report = json.loads((imported / IMPORT_REPORT).read_text())
    assert report["format"] == "gguf" and report["architecture"] == "LlamaForCausalLM"
    assert report["gguf"]["tensor_types"] == {"Q8_0": 1, "Q4_1": 14, "F32": 5}  # quantized at source
    assert report["size_bytes"] == source[0].stat().st_size and len(report["sha256"]) == 64
    assert (report["attention_heads"], report["key_value_heads"], report["tied_embeddings"]) == (4, 2, True)
    assert report["check"]["max_abs_logit_diff_after_reload"] == 0.0 and report["check"]["round_trip_ok"]
    assert len(report["check"]["continuation_ids"]) == 12


def test_an_hf_directory_imports_too(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    report = import_causal_lm(tiny_llama_dir, tmp_path / "teacher")
    assert report["format"] == "hf" and "gguf" not in report
    ids = torch.tensor([[5, 60, 61, 62]])
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "teacher")(ids).logits
        expected = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)(ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_what_cannot_be_imported_faithfully_is_refused(
    source: tuple[Path, Any, Any], imported: Path, tmp_path: Path
) -> None:
    _, model, tokenizer = source
    with pytest.raises(ValueError, match="not empty"):
        import_causal_lm(source[0], imported)
    unknown_split = tmp_path / "llama3.gguf"
    write_tiny_gguf(model, tokenizer, unknown_split, pre="llama-bpe")
    with pytest.raises(ValueError, match="pre-tokenizer 'llama-bpe'"):
        import_causal_lm(unknown_split, tmp_path / "a")
    sentencepiece = tmp_path / "spm.gguf"
    write_tiny_gguf(model, tokenizer, sentencepiece, tokenizer_model="llama")
    with pytest.raises(ValueError, match="byte-level BPE"):
        import_causal_lm(sentencepiece, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_cli_imports_and_says_what_it_wrote(source: tuple[Path, Any, Any], tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["import", str(source[0]), "--out", str(tmp_path / "t"), "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "4 heads / 2 KV heads" in result.output and (tmp_path / "t" / IMPORT_REPORT).is_file()
    result = runner.invoke(app, ["import", str(tmp_path / "missing.gguf"), "--out", str(tmp_path / "u")])
    assert result.exit_code == 2
    result = runner.invoke(app, ["import", str(source[0]), "--out", str(tmp_path / "t")])
    assert result.exit_code == 1 and "not empty" in result.output
