"""`python -m training eval-lm`: a causal-LM teacher and its student scored on the same eval blocks,
perplexity and speed side by side in one process, and written as the pair's distillation report (what
`python -m export` puts into the student's manifest)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import typer
from transformers import AutoTokenizer

from common.cli import line_console
from common.progress import ProgressLog
from training import distil_lm, lm_cache
from training.cli_common import ThreadsOpt, app, setup_threads, user_errors
from training.cli_lm import CpuOpt, RawOpt, TeacherDirOpt, load_lm, pick_device
from training.models import count_parameters
from training.report import DISTILL_REPORT, file_sha256, now, write_report


def distill_report(teacher: Path, student: Path, eval_file: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The scores in the shape of `distill`'s report (training.report), so that `python -m export` puts
    the teacher, both perplexities and their agreement into the student's manifest, as for other tasks."""
    t, s = summary["teacher"], summary["student"]
    state = (
        json.loads((student / "train_state.json").read_text())
        if (student / "train_state.json").exists()
        else {}
    )
    return {
        "task": "text-generation",
        "metric": "perplexity",
        "higher_is_better": False,
        "eval": {"source": str(eval_file), "examples": int(s["tokens"]), "sha256": file_sha256(eval_file)},
        "recipe": {"stage": "distil-lm (cached top-k logits)", **state.get("config", {})},
        "teacher": {
            "source": str(teacher),
            "score": t["perplexity"],
            "params": t["params"],
            "layers": t["layers"],
        },
        "student": {
            "score": s["perplexity"],
            "params": s["params"],
            "layers": s["layers"],
            "layer_map": state.get("config", {}).get("layer_map"),
        },
        "agreement": summary["agreement"],
        "created_at": now(),
    }


@app.command(name="eval-lm")
def eval_lm_command(
    teacher: Path = TeacherDirOpt,
    student: Path = typer.Option(
        ..., "--student", exists=True, file_okay=False, help="Student HF directory."
    ),
    eval_file: Path = typer.Option(
        ..., "--eval", exists=True, dir_okay=False, help="Plain text (e.g. valid)."
    ),
    block_size: int = typer.Option(256, "--block-size", min=8),
    eval_blocks: int | None = typer.Option(
        None, "--eval-blocks", min=1, help="First N blocks (default: all)."
    ),
    batch_size: int = typer.Option(4, "--batch-size", min=1),
    raw: bool = RawOpt,
    decode_tokens: int = typer.Option(
        32, "--decode-tokens", min=1, help="Greedy tokens for the decode speed."
    ),
    cpu: bool = CpuOpt,
    threads: int | None = ThreadsOpt,
) -> None:
    """Perplexity of teacher and student on the same blocks of the eval text (in text order), and their
    speed side by side in this process: forward tokens/s over those blocks, greedy decode tokens/s."""
    setup_threads(threads)
    console = line_console()
    with user_errors():
        device = pick_device(cpu)
        tokenizer = AutoTokenizer.from_pretrained(teacher)
        tokens = lm_cache.text_blocks(eval_file, tokenizer, block_size, seed=None, raw=raw)
        blocks = torch.from_numpy(np.asarray(tokens[:eval_blocks], dtype=np.int64))
        prompt = blocks[:1, :16]
        scores: dict[str, dict[str, float]] = {}
        choices: dict[str, list[torch.Tensor]] = {"teacher": [], "student": []}
        windows: dict[str, list[dict[str, float]]] = {}
        for name, path in (("teacher", teacher), ("student", student)):
            model = load_lm(path, device)
            with ProgressLog(f"eval-lm {name}", active=True):
                ppl = distil_lm.perplexity(model, blocks, batch_size, choices[name])
                decode = distil_lm.decode_speed(model, prompt, decode_tokens)
            windows[name] = ppl.pop("by_position")
            scores[name] = {
                **ppl,
                "decode_tokens_per_s": decode["tokens_per_s"],
                "layers": int(model.config.num_hidden_layers),
                "params": count_parameters(model),
            }
            del model
    t, s = scores["teacher"], scores["student"]
    agreement = float((torch.cat(choices["teacher"]) == torch.cat(choices["student"])).float().mean())
    by_position = [
        {
            "from": tw["from"],
            "to": tw["to"],
            "teacher": tw["perplexity"],
            "student": sw["perplexity"],
            "ratio": sw["perplexity"] / tw["perplexity"],
        }
        for tw, sw in zip(windows["teacher"], windows["student"], strict=True)
    ]
    summary = {
        "eval": str(eval_file),
        "eval_blocks": len(blocks),
        "block_size": block_size,
        "raw": raw,
        "device": str(device),
        "threads": torch.get_num_threads(),
        **scores,
        "perplexity_ratio": s["perplexity"] / t["perplexity"],
        "forward_speedup": s["tokens_per_s"] / t["tokens_per_s"],
        "decode_speedup": s["decode_tokens_per_s"] / t["decode_tokens_per_s"],
        "agreement": agreement,
        "by_position": by_position,
    }
    distil_lm.write_json(student / "lm_eval.json", summary)
    write_report(student, DISTILL_REPORT, distill_report(teacher, student, eval_file, summary))
    for name, row in scores.items():
        console.print(
            f"{name}: {row['layers']:.0f} layers, perplexity {row['perplexity']:.2f}, forward "
            f"{row['tokens_per_s']:.0f} tokens/s, decode {row['decode_tokens_per_s']:.1f} tokens/s",
            soft_wrap=True,
        )
    console.print(
        f"student/teacher perplexity {s['perplexity'] / t['perplexity']:.3f}, next-token agreement "
        f"{agreement:.3f}; speed-up forward "
        f"{s['tokens_per_s'] / t['tokens_per_s']:.2f}x, decode "
        f"{s['decode_tokens_per_s'] / t['decode_tokens_per_s']:.2f}x "
        f"({len(blocks)} blocks x {block_size} tokens of {eval_file})",
        soft_wrap=True,
    )
    if len(by_position) > 1:  # where in a block the student falls behind
        console.print(
            "student/teacher perplexity by position: "
            + ", ".join(f"{w['from']}-{w['to']} {w['ratio']:.3f}" for w in by_position),
            soft_wrap=True,
        )
