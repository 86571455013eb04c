"""Import a causal LM (a GGUF file or a local HF directory) as an HF model directory the pipeline takes as a
teacher: float32 safetensors, config, fast tokenizer, generation config, chat template, and
`import_report.json` saying where it came from (checksum, quantization at source) and that it reloads.

The directory is checked before the import ends: reloaded from disk, it must tokenize a probe as the source
did and give the same logits as the model in memory, and its greedy continuation of the probe is recorded.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from common.provenance import git_revision, sha256_of
from training.gguf_source import GGUFSummary, byte_level_tokenizer, load_gguf_model, read_gguf
from training.models import check_trained_for
from training.report import now

IMPORT_REPORT = "import_report.json"
DEFAULT_PROBE = "The capital of France is Paris. The capital of Germany is"
PROBE_NEW_TOKENS = 12
# Non-ASCII text whose bytes must survive encode -> decode (a byte-level tokenizer splits characters).
ROUND_TRIP = "naïve café — 日本語 🙂\n\n  two  spaces\ttab 2024"


@dataclass
class Loaded:
    """A source read into memory, before it is written."""

    model: Any
    tokenizer: Any
    source_format: str  # "gguf" or "hf"
    gguf: GGUFSummary | None = None
    seconds: float = 0.0


def load_source(source: Path) -> Loaded:
    """The model (float32) and fast tokenizer of a .gguf file or an HF causal LM directory."""
    started = time.perf_counter()
    if source.is_file() and source.suffix == ".gguf":
        summary, fields = read_gguf(source)
        tokenizer = byte_level_tokenizer(fields, summary.context_length)
        model = load_gguf_model(source)
        _align_special_ids(model, tokenizer)
        return Loaded(model, tokenizer, "gguf", summary, time.perf_counter() - started)
    if not (source / "config.json").is_file():
        raise ValueError(f"{source} is neither a .gguf file nor an HF model directory (no config.json)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    if not tokenizer.is_fast:
        raise ValueError(f"{source} has no fast tokenizer (tokenizer.json); the service needs one")
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    return Loaded(model, tokenizer, "hf", None, time.perf_counter() - started)


def _align_special_ids(model: Any, tokenizer: Any) -> None:
    """The config and generation config name the tokenizer's special ids (the file's own)."""
    from transformers import GenerationConfig

    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    for name, value in ids.items():
        setattr(model.config, name, value)
    model.generation_config = GenerationConfig(**ids)


def save(loaded: Loaded, out: Path) -> None:
    """Write the model as float32 safetensors (rebuilt from its config first: transformers refuses to save
    a GGUF-loaded model), the tokenizer (tokenizer.json, chat template) and the generation config."""
    from transformers import AutoModelForCausalLM

    model = loaded.model
    if loaded.source_format == "gguf":
        fresh = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
        fresh.load_state_dict(model.state_dict())
        fresh.generation_config = model.generation_config
        model = fresh
    model.save_pretrained(out, safe_serialization=True)
    loaded.tokenizer.save_pretrained(out)


@torch.inference_mode()
def check_reload(loaded: Loaded, out: Path, probe: str) -> dict[str, Any]:
    """Reload `out` from disk and compare it with the model in memory; the probe's greedy continuation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer(probe, return_tensors="pt")["input_ids"]
    if ids[0].tolist() != loaded.tokenizer(probe)["input_ids"]:
        raise ValueError(f"{out}: the saved tokenizer encodes the probe differently from the source's")
    round_trip = tokenizer.decode(tokenizer(ROUND_TRIP)["input_ids"]) == ROUND_TRIP
    if not round_trip:
        raise ValueError(f"{out}: the tokenizer does not decode its own encoding of {ROUND_TRIP!r}")
    diff = (model(ids).logits - loaded.model(ids).logits).abs().max().item()
    generated = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=PROBE_NEW_TOKENS,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )[0, ids.shape[1] :]
    return {
        "probe": probe,
        "probe_ids": ids[0].tolist(),
        "continuation": tokenizer.decode(generated, skip_special_tokens=False),
        "continuation_ids": generated.tolist(),
        "max_abs_logit_diff_after_reload": diff,
        "round_trip_ok": round_trip,
    }


def describe(loaded: Loaded, source: Path) -> dict[str, Any]:
    """The import report's account of the source and of the model's shape."""
    config, tokenizer = loaded.model.config, loaded.tokenizer
    described: dict[str, Any] = {
        "source": str(source),
        "format": loaded.source_format,
        "architecture": (config.architectures or [type(loaded.model).__name__])[0],
        "model_type": config.model_type,
        "params": sum(p.numel() for p in loaded.model.parameters()),
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "attention_heads": config.num_attention_heads,
        "key_value_heads": getattr(config, "num_key_value_heads", config.num_attention_heads),
        "vocab_size": config.vocab_size,
        "context_length": getattr(config, "max_position_embeddings", None),
        "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "tokenizer": {
            "vocab_size": len(tokenizer),
            "special_tokens": tokenizer.special_tokens_map,
            "chat_template": tokenizer.chat_template is not None,
        },
    }
    if source.is_file():
        described |= {"sha256": sha256_of(source), "size_bytes": source.stat().st_size}
    if loaded.gguf is not None:
        described["gguf"] = asdict(loaded.gguf)
    return described


def import_causal_lm(
    source: Path,
    out: Path,
    probe: str = DEFAULT_PROBE,
    progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Import `source` into `out` (written whole or not at all); returns the import report."""
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty: import into a new directory")
    progress(f"reading {source.name} (a GGUF file is dequantized to float32)")
    loaded = load_source(source)
    check_trained_for(loaded.model.config, "text-generation", source)
    started = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".import-", dir=out.parent) as tmp:
        staging = Path(tmp) / "model"
        progress(f"writing float32 safetensors and the tokenizer into {out}")
        save(loaded, staging)
        saved = time.perf_counter()
        progress("reloading the written directory and checking it against the source")
        check = check_reload(loaded, staging, probe)
        report = {
            **describe(loaded, source),
            "check": check,
            "seconds": {
                "load": round(loaded.seconds, 1),
                "save": round(saved - started, 1),
                "check": round(time.perf_counter() - saved, 1),
            },
            "created_at": now(),
            "git_revision": git_revision(),
        }
        (staging / IMPORT_REPORT).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            out.rmdir()  # empty, checked above
        shutil.move(staging, out)
    return report
