"""What a grammar costs a decode step, in-process: the same rows decoded greedy, plain and under a JSON
schema's masks (service.generation.grammar), taking turns.

    python -m benchmarks.grammar_step --repository build/real/smollm2/models --model smollm2-teacher \\
        --rows 8 --rounds 8

Each round builds a fresh runner, prefills `--rows` copies of one prompt (each with its own last token),
then times `--steps` decode steps of all rows; the report gives each round's median step, the median over
rounds and the ratio. No server, no other prompts between the steps: the mask's cost alone (computing each
row's allowed tokens, choosing among them, advancing the matcher). Writes OUT/grammar-step-MODEL.md.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from benchmarks.structured_output import SCHEMA
from common.cli import one_command_app
from service.engine import OrtEngine
from service.generation.grammar import Grammars, json_grammar
from service.generation.runner import DecoderRunner
from service.generation.sampling import SamplingParams
from service.generation.scheduler import StepPlan
from service.generation.sequence import Sequence
from service.repository import read_version
from service.tokenization import TextEncoder

console = Console(stderr=True)
PROMPT = "Answer in JSON: the topic, tone and year of the passage. Passage: The Stela 16 of Tikal"


def decode_steps(
    runner: DecoderRunner, prompt: list[int], rows: int, steps: int, grammar: str | None, grammars: Grammars
) -> list[float]:
    """Seconds of each decode step of `rows` sequences after one prefill, each token recorded (and its
    matcher advanced) as the engine thread records it."""
    seqs = [
        Sequence(prompt=[*prompt, 10 + i], params=SamplingParams(max_new_tokens=steps + 1, grammar=grammar))
        for i in range(rows)
    ]
    for s in seqs:
        s.grammar = grammars.start(grammar) if grammar is not None else None
    plan = StepPlan(prefill=seqs, decode=[])
    times = []
    for step in range(steps + 1):
        started = time.perf_counter()
        result = runner.execute(plan)
        if step:
            times.append(time.perf_counter() - started)
        for s in seqs:
            s.output.append(result.tokens[s.id])
            if s.grammar is not None:
                s.grammar.advance(result.tokens[s.id])
        plan = StepPlan(prefill=[], decode=seqs)
    return times


def main(
    repository: Annotated[Path, typer.Option(help="Model repository holding --model.")],
    model: Annotated[str, typer.Option(help="A generation model's name.")],
    rows: Annotated[int, typer.Option(min=1, help="Sequences decoded together.")] = 8,
    steps: Annotated[int, typer.Option(min=1, help="Decode steps timed a round.")] = 20,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds of each way, taking turns.")] = 8,
    out: Annotated[Path, typer.Option(help="Directory of the report.")] = Path("docs/bench"),
) -> None:
    """A decode step's time with and without a JSON schema's masks, in-process."""
    version = read_version(repository / model / str(max(int(p.name) for p in (repository / model).iterdir())))
    layout = version.manifest.generation
    if layout is None:
        raise typer.BadParameter(f"{model} is not a generation model", param_hint="--model")
    tokenizer_file = version.file(version.manifest.tokenizer.file)
    engine = OrtEngine(version.file("model.onnx"), device="cpu")
    prompt = [
        int(t) for t in TextEncoder(tokenizer_file, version.manifest.tokenizer).encode([PROMPT])[0].input_ids
    ]
    prompt = prompt[
        -(version.manifest.max_sequence_length - steps - 2) :
    ]  # its end, where the window is small
    grammars = Grammars(tokenizer_file, layout.stop_ids())
    grammar = json_grammar(SCHEMA)
    grammars.start(grammar)  # llguidance's tokenizer built before any timing
    medians: dict[str, list[float]] = {"plain": [], "json_schema": []}
    for _ in range(rounds):
        for way in medians:
            runner = DecoderRunner(engine, layout)
            times = decode_steps(
                runner, prompt, rows, steps, grammar if way == "json_schema" else None, grammars
            )
            medians[way].append(statistics.median(times))
    plain, masked = (statistics.median(medians[w]) for w in medians)
    command = (
        f"python -m benchmarks.grammar_step --repository {repository} --model {model} --rows {rows} "
        f"--steps {steps} --rounds {rounds}"
    )
    lines = [
        "# A decode step with and without a JSON schema's masks (python -m benchmarks.grammar_step)",
        "",
        f"`{command}`",
        "",
        "| way | each round's median step, ms | median of rounds, ms |",
        "|---|---|---|",
        *(
            f"| {w} | {', '.join(f'{1000 * m:.1f}' for m in ms)} | {1000 * statistics.median(ms):.1f} |"
            for w, ms in medians.items()
        ),
        "",
        f"json_schema ÷ plain: **{masked / plain:.3f}** ({rows} rows, "
        f"{1000 * (masked - plain) / rows:.2f} ms a row a step)",
    ]
    out.mkdir(parents=True, exist_ok=True)
    report = "\n".join(lines) + "\n"
    (out / f"grammar-step-{model}.md").write_text(report)
    console.print(report)


app = one_command_app(main, help=__doc__)

if __name__ == "__main__":
    app()
