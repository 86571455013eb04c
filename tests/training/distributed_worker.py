"""One rank of the 2-process CPU test (tests/training/test_distributed.py), started by torchrun.

Distils a tiny BERT student from a tiny BERT teacher on synthetic token ids three times: straight through,
killed mid-run, and resumed from its checkpoints. Writes `rank-<i>.json` to the output directory: a hash
of the final weights of the straight and the resumed run, and the example ids this rank trained on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn
from accelerate import PartialState
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification

from training.losses import LossTerms, distillation_loss
from training.recipes import TrainConfig
from training.trainer import Batch, StepFn, train

EXAMPLES, BATCH_SIZE, EPOCHS = 32, 4, 2
CONFIG = BertConfig(
    vocab_size=40,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=32,
    num_labels=2,
)


class Crash(Exception):
    """Stands in for a killed job."""


def examples() -> list[dict[str, list[int]]]:
    generator = torch.Generator().manual_seed(0)
    rows = []
    for i in range(EXAMPLES):
        length = int(torch.randint(4, 12, (1,), generator=generator))
        ids = torch.randint(5, CONFIG.vocab_size, (length,), generator=generator).tolist()
        rows.append({"input_ids": [2, *ids], "labels": [i % 2], "idx": [i]})
    return rows


def collate(rows: list[dict[str, list[int]]]) -> Batch:
    """Right-pad to the longest row, as training.classification does."""
    longest = max(len(r["input_ids"]) for r in rows)
    pads = [longest - len(r["input_ids"]) for r in rows]
    return {
        "input_ids": torch.tensor([r["input_ids"] + [0] * pad for r, pad in zip(rows, pads, strict=True)]),
        "attention_mask": torch.tensor([[1] * (longest - pad) + [0] * pad for pad in pads]),
        "labels": torch.tensor([r["labels"][0] for r in rows]),
        "idx": torch.tensor([r["idx"][0] for r in rows]),
    }


def loader() -> DataLoader:
    return DataLoader(
        examples(),  # type: ignore[arg-type]  # a list is a map-style dataset
        batch_size=BATCH_SIZE,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        collate_fn=collate,
    )


def distill_step(seen: list[int], crash_after: int | None = None) -> StepFn:
    """A classification distillation step that also notes which examples this rank trained on."""

    def step(student: nn.Module, batch: Batch, teacher: nn.Module | None) -> LossTerms:
        if crash_after is not None and len(seen) >= crash_after * BATCH_SIZE:
            raise Crash
        assert teacher is not None
        seen.extend(batch["idx"].tolist())
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        with torch.no_grad():
            teacher_logits = teacher(**inputs).logits
        return distillation_loss(
            student(**inputs).logits,
            teacher_logits,
            batch["labels"],
            temperature=2.0,
            alpha_kd=0.5,
            alpha_hard=0.5,
        )

    return step


def run(
    cfg: TrainConfig, seen: list[int], crash_after: int | None = None
) -> tuple[str, list[dict[str, float]]]:
    """Fresh models (the same on every rank: same seed), one train() call; the weights' hash and history."""
    torch.manual_seed(0)
    teacher, student = BertForSequenceClassification(CONFIG), BertForSequenceClassification(CONFIG)

    def evaluate(model: nn.Module) -> dict[str, float]:  # main process only; shared by train()
        return {"accuracy": 0.5}

    history = train(
        student, loader(), distill_step(seen, crash_after), cfg, teacher=teacher, evaluate=evaluate
    )
    digest = hashlib.sha256()
    for name, tensor in sorted(student.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest(), history.epochs


def main(out: Path) -> None:
    torch.set_num_threads(1)
    cfg = TrainConfig(
        epochs=EPOCHS,
        lr=1e-3,
        batch_size=BATCH_SIZE,
        cpu=True,
        early_stop_patience=5,  # exercises the eval metrics shared by the main process; never triggers
        checkpoint_every_steps=3,
    )
    seen: list[int] = []
    straight, epochs = run(replace(cfg, checkpoint_dir=str(out / "straight")), seen)
    with contextlib.suppress(Crash):  # killed after 7 of each rank's 2 x 4 steps: resumes from step 6
        run(replace(cfg, checkpoint_dir=str(out / "resumed")), [], crash_after=7)
    resumed, _ = run(replace(cfg, checkpoint_dir=str(out / "resumed"), resume=True), [])
    rank = PartialState().process_index
    record = {"straight": straight, "resumed": resumed, "seen": seen, "epochs": epochs}
    (out / f"rank-{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
