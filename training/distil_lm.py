"""A shallower causal LM distilled from a cache of its teacher's top-k logits (training/lm_cache.py).

Read top to bottom: the run's settings, the student cut from the teacher, the data order, the learning rate,
one loop that checkpoints and resumes, then perplexity and speed for both models.

Resuming: `checkpoint.pt` in the output directory holds the student, the optimiser, the step and the
settings. Which blocks a step reads and its learning rate are functions of the step alone, so a run stopped
at step s and started again gives the same weights as one that never stopped. The number of cache blocks
is fixed at the first start: a cache grown later does not change a resumed run's data.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, PreTrainedModel

from training.attention_transfer import attention_loss, attention_modules, matched_layers
from training.lm_cache import CachedBlocks
from training.losses import LossTerms, top_k_distillation_loss
from training.models import default_layer_map, make_student

CHECKPOINT = "checkpoint.pt"


@dataclass
class DistilLMConfig:
    """One distillation run; saved in the checkpoint so a resumed run continues the same one."""

    layers: int = 10
    layer_map: list[int] = field(default_factory=list)  # empty: spread evenly (models.default_layer_map)
    steps: int = 1000  # the whole run (the learning-rate schedule spans it); a session may stop earlier
    batch_size: int = 4
    grad_accum: int = 1
    lr: float = 3e-4
    warmup_steps: int = 20
    weight_decay: float = 0.0
    temperature: float = 1.0
    alpha_kd: float = 1.0
    alpha_hard: float = 0.0
    top_k: int = 0  # 0: every logit the cache holds
    # the teacher's mass outside its top k as one more class, where the cache records it and T = 1 (else the
    # top k renormalised, which pulls all the student's mass into them: losses.top_k_distillation_loss)
    kd_rest: bool = True
    seed: int = 0
    num_blocks: int = 0  # cache blocks used, fixed at the first start
    bf16: bool = False  # autocast to bfloat16 (a GPU's fast path)
    freeze_embeddings: bool = False  # keep the teacher's token embeddings (and the head tied to them)
    student_init: str = ""  # an earlier student's directory to start from (its layers, its map); "": a cut
    # the student's attention matched to the teacher's in these teacher layers (each one it kept), weighted
    # so; the teacher then runs beside the student at every step (training/attention_transfer.py)
    alpha_attention: float = 0.0
    attention_layers: list[int] = field(default_factory=list)
    attention_every: int = 1  # the term on every n-th step only: the others skip the teacher and eager kernel


# --------------------------------------------------------------------------- student


def student_from_teacher(teacher: PreTrainedModel, config: DistilLMConfig) -> PreTrainedModel:
    """Embeddings, final norm and (tied) head copied; layer i is teacher layer layer_map[i].

    With `config.student_init`, an earlier student instead (continued on other text, e.g. the text as
    written): its depth and layer map are taken, and it must share the teacher's width and vocabulary."""
    if config.student_init:
        return _earlier_student(teacher, config)
    if not config.layer_map:
        config.layer_map = default_layer_map(int(teacher.config.num_hidden_layers), config.layers)
    student = make_student(teacher, config.layers, config.layer_map)
    if config.freeze_embeddings:
        student.get_input_embeddings().requires_grad_(False)  # a tied head is the same tensor
    return student


def _earlier_student(teacher: PreTrainedModel, config: DistilLMConfig) -> PreTrainedModel:
    student: PreTrainedModel = AutoModelForCausalLM.from_pretrained(config.student_init, dtype=torch.float32)
    for setting in ("vocab_size", "hidden_size", "model_type"):
        if getattr(student.config, setting) != getattr(teacher.config, setting):
            raise ValueError(
                f"{config.student_init} is not a student of this teacher: its {setting} is "
                f"{getattr(student.config, setting)}, the teacher's {getattr(teacher.config, setting)}"
            )
    state = Path(config.student_init) / "train_state.json"
    config.layers = int(student.config.num_hidden_layers)
    config.layer_map = json.loads(state.read_text())["config"]["layer_map"] if state.exists() else []
    if config.freeze_embeddings:
        student.get_input_embeddings().requires_grad_(False)
    return student


# --------------------------------------------------------------------------- data order and schedule


def micro_batch_rows(index: int, batch_size: int, num_blocks: int, seed: int) -> np.ndarray:
    """The cache rows of micro-batch `index`: epochs are seeded permutations laid end to end."""
    positions = index * batch_size + np.arange(batch_size)
    epochs, offsets = positions // num_blocks, positions % num_blocks
    orders = {int(e): np.random.default_rng([seed, int(e)]).permutation(num_blocks) for e in set(epochs)}
    return np.array([orders[int(e)][o] for e, o in zip(epochs, offsets, strict=True)])


def learning_rate(step: int, config: DistilLMConfig) -> float:
    """Linear warm-up, then cosine down to a tenth of the peak at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


# --------------------------------------------------------------------------- one step


def cached_kd_loss(
    model: PreTrainedModel,
    batch: dict[str, torch.Tensor],
    config: DistilLMConfig,
    teacher: PreTrainedModel | None = None,
) -> LossTerms:
    """Position i's logits against the teacher's top k at i and the token at i + 1 (blocks are full); with
    `teacher` and `config.alpha_attention`, plus the attention of the matched layers against the teacher's."""
    ids = batch["input_ids"]
    attention = None
    if teacher is not None and config.alpha_attention > 0:
        pairs = matched_layers(config.layer_map, config.attention_layers)
        logits, attention = attention_loss(model, teacher, ids, pairs)
    else:
        logits = model(input_ids=ids).logits
    mass = batch.get("mass") if config.kd_rest and config.temperature == 1 else None
    terms = top_k_distillation_loss(
        logits[:, :-1],
        batch["values"][:, :-1],
        batch["indices"][:, :-1],
        ids[:, 1:],
        temperature=config.temperature,
        alpha_kd=config.alpha_kd,
        alpha_hard=config.alpha_hard,
        teacher_mass=None if mass is None else mass[:, :-1],
    )
    if attention is None:
        return terms
    return terms._replace(total=terms.total + config.alpha_attention * attention, attention=attention)


# --------------------------------------------------------------------------- the loop


def _save(path: Path, state: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash mid-save leaves the previous checkpoint whole


def load_checkpoint(out: Path) -> dict[str, object] | None:
    path = Path(out) / CHECKPOINT
    return torch.load(path, map_location="cpu", weights_only=False) if path.exists() else None


def train(
    student: PreTrainedModel,
    blocks: CachedBlocks,
    config: DistilLMConfig,
    out: Path,
    *,
    checkpoint_every: int = 50,
    time_limit_s: float | None = None,
    stop_after_steps: int | None = None,
    log: Callable[[int, dict[str, float]], None] | None = None,
    teacher: PreTrainedModel | None = None,
) -> int:
    """Train `student` from the cache up to `config.steps`, resuming from out/checkpoint.pt if there.

    Checkpoints every `checkpoint_every` steps and whenever it stops: at the end, after `time_limit_s`
    seconds, or after `stop_after_steps` steps of this session (tests). Returns the step reached. `teacher`
    (on the student's device) is needed when `config.alpha_attention` is set, and only then.
    """
    if config.alpha_attention > 0:
        if teacher is None:
            raise ValueError("matching the teacher's attention needs the teacher beside the student")
        pairs = matched_layers(config.layer_map, config.attention_layers)  # a layer the student lacks fails
        attention_modules(student, [s for s, _ in pairs])  # so does a model family it cannot read
        attention_modules(teacher, [t for _, t in pairs])
        teacher.eval().requires_grad_(False)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = next(student.parameters()).device
    trained = [p for p in student.parameters() if p.requires_grad]
    decay = [p for p in trained if p.dim() >= 2]
    no_decay = [p for p in trained if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
    )
    step = 0
    state = load_checkpoint(out)
    if state is not None:
        student.load_state_dict(state["model"])  # type: ignore[arg-type]
        optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]
        step = int(state["step"])  # type: ignore[call-overload]
    if not config.num_blocks:
        config.num_blocks = len(blocks)
    if config.num_blocks > len(blocks):
        raise ValueError(f"the run uses {config.num_blocks} cache blocks, the cache has {len(blocks)}")

    def checkpoint() -> None:
        _save(
            out / CHECKPOINT,
            {
                "model": student.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
                "config": asdict(config),
            },
        )

    student.train()
    started, session_steps = time.monotonic(), 0
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bf16)
    while step < config.steps:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        totals = {"loss": 0.0, "kd": 0.0, "hard": 0.0}
        for micro in range(config.grad_accum):
            rows = micro_batch_rows(
                step * config.grad_accum + micro, config.batch_size, config.num_blocks, config.seed
            )
            batch = {k: v.to(device) for k, v in blocks.batch(rows, config.top_k or None).items()}
            beside = teacher if step % config.attention_every == 0 else None
            with autocast:
                terms = cached_kd_loss(student, batch, config, beside)
            (terms.total / config.grad_accum).backward()
            named = {"loss": terms.total, "kd": terms.kd, "hard": terms.hard, "attention": terms.attention}
            for name, value in named.items():
                if value is not None:
                    totals[name] = totals.get(name, 0.0) + float(value.detach()) / config.grad_accum
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        session_steps += 1
        if log is not None:
            log(step, {**totals, "lr": learning_rate(step - 1, config)})
        if step % checkpoint_every == 0:
            checkpoint()
        if stop_after_steps is not None and session_steps >= stop_after_steps:
            break
        if time_limit_s is not None and time.monotonic() - started >= time_limit_s:
            break
    checkpoint()
    student.eval()
    return step


# --------------------------------------------------------------------------- evaluation and speed


def position_windows(length: int) -> list[tuple[int, int]]:
    """Windows of predicted positions in a block of `length` tokens, doubling: [1, 64), [64, 128), ...
    Where in a long block a student falls behind says whether it uses the context the teacher uses."""
    edges = [1] + [edge for edge in (64 * 2**i for i in range(32)) if edge < length] + [length]
    return list(itertools.pairwise(edges))


@torch.inference_mode()
def perplexity(
    model: PreTrainedModel,
    blocks: torch.Tensor,
    batch_size: int = 8,
    top1: list[torch.Tensor] | None = None,
) -> dict[str, Any]:
    """exp(mean NLL) of every token after the first of each full block [N, L], also per window of positions
    in the block (`by_position`); and the forward tokens/s. `top1`, when given, receives the model's
    next-token choice at those positions, batch by batch."""
    model.eval()
    device = next(model.parameters()).device
    nll_by_position = torch.zeros(blocks.size(1) - 1, dtype=torch.float64)
    started = time.perf_counter()
    for start in range(0, len(blocks), batch_size):
        ids = blocks[start : start + batch_size].to(device)
        logits = model(input_ids=ids).logits[:, :-1].float()
        nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # [B, L-1]
        nll_by_position += nll.sum(0).double().cpu()
        if top1 is not None:
            top1.append(logits.argmax(-1).cpu())
    seconds = time.perf_counter() - started
    count = len(blocks) * nll_by_position.numel()
    nll_mean = float(nll_by_position.sum()) / count
    by_position = [
        {
            "from": lo,
            "to": hi,
            "perplexity": math.exp(float(nll_by_position[lo - 1 : hi - 1].mean()) / len(blocks)),
        }
        for lo, hi in position_windows(blocks.size(1))
    ]
    return {
        "perplexity": math.exp(nll_mean),
        "nll": nll_mean,
        "tokens": count,
        "seconds": seconds,
        "tokens_per_s": blocks.numel() / seconds,
        "by_position": by_position,
    }


@torch.inference_mode()
def decode_speed(model: PreTrainedModel, prompt: torch.Tensor, new_tokens: int = 32) -> dict[str, float]:
    """Greedy decoding at one stream with the KV cache: new tokens/s (what a served model feels like)."""
    model.eval()
    ids = prompt.to(next(model.parameters()).device)
    model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)  # type: ignore[operator]  # warm-up
    started = time.perf_counter()
    model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)  # type: ignore[operator]
    seconds = time.perf_counter() - started
    return {"new_tokens": new_tokens, "seconds": seconds, "tokens_per_s": new_tokens / seconds}


def write_json(path: Path, data: object) -> None:
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
