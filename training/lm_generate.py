"""The teacher's own continuations of the training text: more text for a student that has seen all of it.

A 10-layer SmolLM2 student distilled on WikiText-2 train (2.5 M tokens) stops gaining past ~10 passes and then
loses: its perplexity ratio on valid went 1.41 (5 passes), 1.30 (10), 1.43 (16) while its training loss kept
falling (docs/benchmarks.md). More text is the lever, and the teacher writes it: each prompt is the first
tokens of a real training line, the rest is sampled from the teacher (sequence-level KD, Kim & Rush 2016;
DistillSpec's teacher-generated data). `lm-cache` then records the teacher's top-k over the new text like over
any other, and the student trains on both (the text's own next token there is the teacher's sample).

The output is plain text, one paragraph a line like WikiText: a continuation is cut into lines where the
teacher writes newlines (the cache joins lines with eos, as it does for the real paragraphs). Generation is
resumable: batches are appended in order, and `<out>.progress.json` records how many prompts are written and
the file's length then, so an interrupted run truncates any half-written batch and continues; each batch is
sampled from its own seed, so a resumed file equals an uninterrupted one (at the same batch size).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from training.data.loaders import load_text_data


@dataclass(frozen=True)
class GenerateSettings:
    """What a run samples; a resumed run must ask for the same (else one file would mix two samplings)."""

    teacher: str
    source: str
    prompts: int  # continuations wanted in all (the eligible lines are cycled through when fewer)
    prompt_tokens: int  # every prompt has exactly this many tokens, so a batch needs no padding
    new_tokens: int
    temperature: float
    top_p: float
    seed: int


def progress_path(out: Path) -> Path:
    return out.with_name(out.name + ".progress.json")


def prompts_done(out: Path) -> int:
    path = progress_path(out)
    return int(json.loads(path.read_text())["prompts_done"]) if path.exists() else 0


def prompt_ids(
    lines: list[str], tokenizer: PreTrainedTokenizerBase, settings: GenerateSettings
) -> np.ndarray:
    """[prompts, prompt_tokens] int64: the first tokens of lines long enough, in a seeded order, cycled."""
    encoded = tokenizer(lines, add_special_tokens=False, verbose=False)["input_ids"]
    eligible = [ids[: settings.prompt_tokens] for ids in encoded if len(ids) >= settings.prompt_tokens]
    if not eligible:
        raise ValueError(f"no line of {settings.source} has {settings.prompt_tokens} tokens to prompt with")
    order = np.random.default_rng(settings.seed).permutation(len(eligible))
    picks = np.resize(order, settings.prompts)  # cycles: a second round samples the same prompts afresh
    return np.asarray([eligible[i] for i in picks], dtype=np.int64)


@torch.inference_mode()
def continue_batch(
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: torch.Tensor,
    settings: GenerateSettings,
    seed: int,
    bf16: bool = False,
) -> list[str]:
    """The teacher's sampled continuations of equal-length prompts, each as text with its prompt.
    `bf16`: bfloat16 autocast (a GPU's fast path; the samples differ from float32's in the last bits)."""
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    with torch.autocast(prompts.device.type, dtype=torch.bfloat16, enabled=bf16):
        output = teacher.generate(  # type: ignore[operator]
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=True,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=0,
            max_new_tokens=settings.new_tokens,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    return tokenizer.batch_decode(output, skip_special_tokens=True)


def paragraphs(text: str) -> list[str]:
    """A continuation as WikiText-like lines: split at newlines, blank ones dropped."""
    return [line.strip() for line in text.split("\n") if line.strip()]


def _write_progress(out: Path, settings: GenerateSettings, done: int, size: int) -> None:
    path = progress_path(out)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"settings": asdict(settings), "prompts_done": done, "bytes": size}, indent=2))
    os.replace(tmp, path)  # write-then-rename: a crash leaves the old count or the new one


def generate(
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out: Path,
    settings: GenerateSettings,
    *,
    batch_size: int = 32,
    bf16: bool = False,
    time_limit_s: float | None = None,
    stop_after_batches: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Append continuations to `out` until `settings.prompts` are written; returns how many are.

    Stops early, with everything written so far counted, after `time_limit_s` seconds or `stop_after_batches`
    batches (for tests).
    """
    out = Path(out)
    path = progress_path(out)
    if path.exists():
        recorded = json.loads(path.read_text())
        if recorded["settings"] != asdict(settings):
            raise ValueError(f"{out} was sampled with {recorded['settings']}, asked for {asdict(settings)}")
        done, size = int(recorded["prompts_done"]), int(recorded["bytes"])
        with out.open("r+b") as handle:  # drop a batch written after the last count
            handle.truncate(size)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"")
        done, size = 0, 0
        _write_progress(out, settings, done, size)
    if done >= settings.prompts:
        return done
    ids = prompt_ids(load_text_data(settings.source).lines, tokenizer, settings)
    device = next(teacher.parameters()).device
    teacher.eval()
    started, batches = time.monotonic(), 0
    with out.open("ab") as handle:
        while done < settings.prompts:
            end = min(done + batch_size, settings.prompts)
            batch = torch.from_numpy(ids[done:end]).to(device)
            seed = settings.seed * 1_000_003 + done
            texts = continue_batch(teacher, tokenizer, batch, settings, seed, bf16)
            lines = [line for text in texts for line in paragraphs(text)]
            handle.write("".join(line + "\n" for line in lines).encode())
            handle.flush()
            os.fsync(handle.fileno())
            done, size = end, handle.tell()
            _write_progress(out, settings, done, size)  # only after the text is on disk
            batches += 1
            if progress is not None:
                progress(done, settings.prompts)
            if stop_after_batches is not None and batches >= stop_after_batches:
                break
            if time_limit_s is not None and time.monotonic() - started >= time_limit_s:
                break
    return done
