"""Perplexity through the service: a text scored by each served generation model with OpenAI's `echo` +
`logprobs` (`max_tokens: 1`, what lm-evaluation-harness's `loglikelihood` asks), beside PyTorch's on the
same tokens when the models' HF directories are given: how faithful the served (ONNX) student is to its
teacher, measured where users meet it.

    python -m benchmarks.served_perplexity --repository build/real/smollm2/models \\
        --models smollm2-teacher,smollm2 --eval ../shared/data/wikitext2_raw_valid.txt --texts 64 \\
        --reference build/real/smollm2/teacher,build/real/smollm2/student-gpu-generated --out docs/bench

Texts: the eval file's first `--texts` paragraphs of at least 20 words (WikiText's ` = Heading = ` lines
skipped), each cut to `--max-chars`, sent `--batch` prompts a request (a list: one choice each). A text's
first token is not scored (nothing comes before it), as in the service's answer.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from benchmarks.servers import serve
from common.cli import cli_app
from common.progress import ProgressLog

console = Console(stderr=True)
app = cli_app(help=__doc__)


def eval_texts(path: Path, count: int, max_chars: int) -> list[str]:
    texts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if len(line.split()) >= 20 and not line.startswith("="):
            texts.append(line[:max_chars].rsplit(" ", 1)[0] if len(line) > max_chars else line)
        if len(texts) == count:
            break
    return texts


def served_scores(base: str, model: str, texts: list[str], batch: int) -> tuple[list[list[float]], float]:
    """Each text's scored tokens' log-probabilities (all but its first), and the seconds it took."""
    scores: list[list[float]] = []
    started = time.perf_counter()
    with httpx.Client(base_url=base, timeout=600) as client:
        for i in range(0, len(texts), batch):
            body = {"model": model, "prompt": texts[i : i + batch], "max_tokens": 1, "temperature": 0}
            r = client.post("/v1/completions", json=body | {"echo": True, "logprobs": 0})
            r.raise_for_status()
            for choice in sorted(r.json()["choices"], key=lambda c: c["index"]):
                scores.append(
                    choice["logprobs"]["token_logprobs"][1:-1]
                )  # the generated token is not the text's
    return scores, time.perf_counter() - started


def torch_scores(model_dir: Path, texts: list[str]) -> list[list[float]]:
    """PyTorch's log-probabilities of the same tokens (the tokenizer's own encoding, specials as served)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            log_probs = torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)
            out.append(log_probs.gather(1, ids[0, 1:, None])[:, 0].tolist())
    return out


def perplexity(scores: list[list[float]]) -> float:
    tokens = sum(len(s) for s in scores)
    return math.exp(-sum(sum(s) for s in scores) / tokens)


@app.command()
def main(
    repository: Annotated[Path, typer.Option(help="Model repository serving the models.")],
    models: Annotated[
        str, typer.Option(help="Comma list of served generation models; the first is the base.")
    ],
    eval_file: Annotated[Path, typer.Option("--eval", exists=True, dir_okay=False, help="Plain text.")],
    texts: Annotated[int, typer.Option(min=1, help="Paragraphs scored.")] = 64,
    max_chars: Annotated[
        int, typer.Option(min=20, help="Each paragraph cut to this many characters.")
    ] = 1200,
    batch: Annotated[int, typer.Option(min=1, max=64, help="Prompts a request.")] = 16,
    reference: Annotated[
        str | None,
        typer.Option(help="Comma list of the models' HF directories, in order: PyTorch's scores too."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Directory of the report.")] = Path("docs/bench"),
) -> None:
    """Each model's perplexity on the text, served and (with --reference) in PyTorch."""
    names = [m for m in models.split(",") if m]
    dirs = [Path(d) for d in reference.split(",")] if reference else []
    if dirs and len(dirs) != len(names):
        raise typer.BadParameter("give one HF directory per model", param_hint="--reference")
    chosen = eval_texts(eval_file, texts, max_chars)
    rows: list[dict[str, Any]] = []
    with ProgressLog.beside(
        console, "served-perplexity", len(names) * (2 if dirs else 1), unit="passes"
    ) as log:
        with serve(repository, {}) as base:
            for name in names:
                log.update(status=f"{name}: served")
                scores, seconds = served_scores(base, name, chosen, batch)
                tokens = sum(len(s) for s in scores)
                rows.append(
                    {"model": name, "tokens": tokens, "served": perplexity(scores), "seconds": seconds}
                )
                rows[-1]["served_scores"] = scores
                log.update(advance=1)
        for row, model_dir in zip(rows, dirs, strict=False):
            log.update(status=f"{row['model']}: PyTorch")
            reference_scores = torch_scores(model_dir, chosen)
            lengths = [len(s) for s in reference_scores]
            if lengths != [len(s) for s in row["served_scores"]]:
                raise RuntimeError(f"{row['model']}: the service and {model_dir} tokenize the texts apart")
            row["pytorch"] = perplexity(reference_scores)
            row["max_token_diff"] = max(
                abs(a - b)
                for served, ref in zip(row["served_scores"], reference_scores, strict=True)
                for a, b in zip(served, ref, strict=True)
            )
            log.update(advance=1)
    for row in rows:
        del row["served_scores"]
    text = report(rows, eval_file, len(chosen), max_chars)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"served-perplexity-{names[0]}"
    (out / f"{stem}.md").write_text(text, encoding="utf-8")
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(text)


def report(rows: list[dict[str, Any]], eval_file: Path, texts: int, max_chars: int) -> str:
    base = rows[0]
    lines = [
        f"# Perplexity through the service: {', '.join(r['model'] for r in rows)}",
        "",
        f"{texts} paragraphs of {eval_file.name} (at most {max_chars} characters each), scored with "
        "`echo` + `logprobs` on /v1/completions; each text's first token unscored.",
        "",
        "| model | tokens scored | served perplexity | ÷ first | PyTorch perplexity | max token \\|diff\\| "
        "| scored tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        torch_ppl = f"{r['pytorch']:.3f}" if "pytorch" in r else "-"
        diff = f"{r['max_token_diff']:.1e}" if "max_token_diff" in r else "-"
        lines.append(
            f"| {r['model']} | {r['tokens']:,} | {r['served']:.3f} | {r['served'] / base['served']:.3f} | "
            f"{torch_ppl} | {diff} | {r['tokens'] / r['seconds']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    app()
