"""A teacher's top-k next-token logits, computed once and memory-mapped: a student trains without the teacher.

On a 2-core CPU the 30-layer teacher's forward pass costs about as much as the student's whole training step:
running it once per token instead of once per token per epoch (and per retry, per hyper-parameter) is what
makes distillation fit. The cache is a directory:

    meta.json       what was cached: teacher, source text, its form, block size, k, seed, number of blocks
    tokens.npy      [N, L] int32  the text as blocks of L tokens, in a seeded order: its prose lines with
                    eos between them, or (raw) the file exactly as written
    values.npy      [N, L, k] fp16  the teacher's k largest logits at every position, largest first
    indices.npy     [N, L, k] int32  their token ids
    mass.npy        [N, L] fp32  the teacher's probability on those k ids (the rest of the vocabulary holds
                    1 - mass: the loss keeps it as one more class); caches of format 1 have none
    progress.json   {"blocks_done": n}: blocks 0..n-1 of values/indices/mass are written

Building is resumable: blocks are written in order, flushed, and only then counted in progress.json, so an
interrupted build (time limit, Ctrl-C, a lost machine) continues from the last counted block, and asking for
more blocks later extends the same cache (the block order is fixed by the seed over the whole text).
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

FORMAT_VERSION = 2  # 2: mass.npy


@dataclass(frozen=True)
class CacheMeta:
    """What a cache holds; a resumed build must ask for the same (else it would mix two caches)."""

    teacher: str
    source: str
    block_size: int
    top_k: int
    seed: int
    num_blocks: int  # blocks in the whole text; progress.json says how many are written
    vocab_size: int
    format_version: int = FORMAT_VERSION
    raw: bool = False  # the file as written (text_blocks); False: its prose lines, eos between them


def token_blocks(
    lines: list[str], tokenizer: PreTrainedTokenizerBase, block_size: int, seed: int | None
) -> np.ndarray:
    """`line <eos> line <eos> ...` cut into full blocks of `block_size` (the tail is dropped), in a seeded
    order: a slice of the first n blocks then samples the whole text rather than its first articles.
    `seed` None keeps the text order (evaluation)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos token to separate the lines")
    encoded = tokenizer(lines, add_special_tokens=False, verbose=False)["input_ids"]
    return cut_blocks(
        np.fromiter((t for ids in encoded for t in (*ids, eos)), dtype=np.int32), block_size, seed
    )


def text_blocks(
    path: str | Path, tokenizer: PreTrainedTokenizerBase, block_size: int, seed: int | None, raw: bool
) -> np.ndarray:
    """A text file as blocks. `raw`: the file exactly as written (line breaks, blank lines, headings), as
    lm-evaluation-harness scores it and as prompts arrive; otherwise its prose lines (token_blocks).

    A student distilled on prose lines alone never sees a line break: on WikiText-2 valid as written, the
    SmolLM2 student's perplexity on newline tokens was 620 (its teacher's 6.3), 384 on the token after one."""
    if not raw:
        return token_blocks(load_text_data(path).lines, tokenizer, block_size, seed)
    text = Path(path).read_text(encoding="utf-8")
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    return cut_blocks(np.asarray(ids, dtype=np.int32), block_size, seed)


def cut_blocks(stream: np.ndarray, block_size: int, seed: int | None) -> np.ndarray:
    """Full blocks of a token stream (the tail dropped), shuffled by `seed` (None: in text order)."""
    count = len(stream) // block_size
    if count == 0:
        raise ValueError(f"{len(stream)} tokens do not fill one block of {block_size}")
    blocks = stream[: count * block_size].reshape(count, block_size)
    if seed is None:
        return blocks
    order = np.random.default_rng(seed).permutation(count)
    return np.ascontiguousarray(blocks[order])


@torch.inference_mode()
def teacher_top_k(
    teacher: PreTrainedModel, input_ids: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k largest logits (float32), their ids, and the probability they hold, at every position of full
    blocks (no padding)."""
    logits = teacher(input_ids=input_ids).logits.float()
    values, indices = logits.topk(k, dim=-1)
    mass = (values - logits.logsumexp(dim=-1, keepdim=True)).exp().sum(dim=-1)
    return values, indices, mass


def _path(name: str | Path) -> str:
    """A path as one spelling (relative or absolute), so a resumed build may name the same file either way."""
    return str(Path(name).resolve())


def _write_json(path: Path, data: object) -> None:
    """Write-then-rename, so a crash leaves the old file or the new one, never half of one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def read_meta(cache: Path) -> CacheMeta:
    return CacheMeta(**json.loads((cache / "meta.json").read_text()))


def blocks_done(cache: Path) -> int:
    progress = cache / "progress.json"
    return int(json.loads(progress.read_text())["blocks_done"]) if progress.exists() else 0


def _create(cache: Path, meta: CacheMeta, tokens: np.ndarray) -> None:
    """A new cache: the token blocks and the (sparse, not yet written) value and index arrays."""
    cache.mkdir(parents=True, exist_ok=True)
    np.save(cache / "tokens.npy", tokens)
    shape = (meta.num_blocks, meta.block_size, meta.top_k)
    np.lib.format.open_memmap(cache / "values.npy", mode="w+", dtype=np.float16, shape=shape).flush()
    np.lib.format.open_memmap(cache / "indices.npy", mode="w+", dtype=np.int32, shape=shape).flush()
    np.lib.format.open_memmap(cache / "mass.npy", mode="w+", dtype=np.float32, shape=shape[:2]).flush()
    _write_json(cache / "progress.json", {"blocks_done": 0})
    _write_json(cache / "meta.json", asdict(meta))  # last: a cache without meta.json is started afresh


def build_cache(
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    text: str | Path,
    cache: Path,
    *,
    teacher_name: str,
    raw: bool = False,
    block_size: int = 256,
    top_k: int = 64,
    seed: int = 0,
    max_blocks: int | None = None,
    batch_size: int = 8,
    time_limit_s: float | None = None,
    stop_after_batches: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Fill the cache up to `max_blocks` blocks (default: all), continuing where an earlier build stopped.

    Stops early, with everything written so far counted, after `time_limit_s` seconds or
    `stop_after_batches` batches (for tests). Returns the number of blocks done.
    """
    cache = Path(cache)
    if (cache / "meta.json").exists():
        meta = read_meta(cache)
        wanted = (_path(teacher_name), _path(text), raw, block_size, top_k, seed)
        have = (_path(meta.teacher), _path(meta.source), meta.raw, meta.block_size, meta.top_k, meta.seed)
        if wanted != have:
            raise ValueError(f"{cache} holds teacher/source/raw/block/k/seed {have}, asked for {wanted}")
    else:
        tokens = text_blocks(text, tokenizer, block_size, seed, raw)
        meta = CacheMeta(
            teacher=teacher_name,
            source=str(text),
            raw=raw,
            block_size=block_size,
            top_k=top_k,
            seed=seed,
            num_blocks=len(tokens),
            vocab_size=int(teacher.config.vocab_size),
        )
        _create(cache, meta, tokens)

    target = meta.num_blocks if max_blocks is None else min(max_blocks, meta.num_blocks)
    done = blocks_done(cache)
    if done >= target:
        return done
    tokens_all = np.load(cache / "tokens.npy", mmap_mode="r")
    values = np.load(cache / "values.npy", mmap_mode="r+")
    indices = np.load(cache / "indices.npy", mmap_mode="r+")
    # a format-1 cache, continued, stays without masses (its earlier blocks have none)
    masses = np.load(cache / "mass.npy", mmap_mode="r+") if (cache / "mass.npy").exists() else None
    device = next(teacher.parameters()).device
    teacher.eval()
    started, batches = time.monotonic(), 0
    while done < target:
        end = min(done + batch_size, target)
        ids = torch.from_numpy(np.asarray(tokens_all[done:end], dtype=np.int64)).to(device)
        top_values, top_indices, top_mass = teacher_top_k(teacher, ids, meta.top_k)
        values[done:end] = top_values.cpu().numpy().astype(np.float16)
        indices[done:end] = top_indices.cpu().numpy().astype(np.int32)
        values.flush()
        indices.flush()
        if masses is not None:
            masses[done:end] = top_mass.cpu().numpy()
            masses.flush()
        done = end
        _write_json(cache / "progress.json", {"blocks_done": done})  # only after the data is on disk
        batches += 1
        if progress is not None:
            progress(done, target)
        if stop_after_batches is not None and batches >= stop_after_batches:
            break
        if time_limit_s is not None and time.monotonic() - started >= time_limit_s:
            break
    return done


@dataclass
class CachedBlocks:
    """The written part of a cache, memory-mapped: nothing is read until a batch asks for it."""

    tokens: np.ndarray
    values: np.ndarray
    indices: np.ndarray
    meta: CacheMeta
    mass: np.ndarray | None = None  # None: a format-1 cache

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, rows: np.ndarray, top_k: int | None = None) -> dict[str, torch.Tensor]:
        """Blocks `rows`: input_ids [B, L] long, teacher values [B, L, k] float32, indices [B, L, k] long,
        and where the cache records it the teacher's probability on those k ids, mass [B, L] float32.

        `top_k` keeps only the first (largest) k of the cached ones: one cache serves any k up to its own.
        """
        k = self.meta.top_k if top_k is None else top_k
        if not 1 <= k <= self.meta.top_k:
            raise ValueError(f"top_k must be in 1..{self.meta.top_k} (the cache's), got {k}")
        rows = np.sort(rows)  # memory maps read faster in order; the batch's order does not matter
        values = torch.from_numpy(np.asarray(self.values[rows], dtype=np.float32))
        batch = {
            "input_ids": torch.from_numpy(np.asarray(self.tokens[rows], dtype=np.int64)),
            "values": values[..., :k].contiguous(),
            "indices": torch.from_numpy(np.asarray(self.indices[rows, :, :k], dtype=np.int64)),
        }
        if self.mass is not None:  # the cached mass is on all its ids; the first k hold their share of it
            share = values.softmax(dim=-1)[..., :k].sum(dim=-1)
            batch["mass"] = torch.from_numpy(np.asarray(self.mass[rows], dtype=np.float32)) * share
        return batch


def open_cache(cache: Path, max_blocks: int | None = None) -> CachedBlocks:
    """The blocks written so far (at most `max_blocks`), memory-mapped read-only."""
    cache = Path(cache)
    meta = read_meta(cache)
    done = blocks_done(cache) if max_blocks is None else min(blocks_done(cache), max_blocks)
    if done == 0:
        raise ValueError(f"{cache} has no blocks written yet: build it first (python -m training lm-cache)")
    return CachedBlocks(
        tokens=np.load(cache / "tokens.npy", mmap_mode="r")[:done],
        values=np.load(cache / "values.npy", mmap_mode="r")[:done],
        indices=np.load(cache / "indices.npy", mmap_mode="r")[:done],
        meta=meta,
        mass=np.load(cache / "mass.npy", mmap_mode="r")[:done] if (cache / "mass.npy").exists() else None,
    )
