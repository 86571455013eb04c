"""Speculative decoding in-process, no HTTP: a teacher alone and drafted by each of several draft graphs,
every setting on the same prompt back to back, so that a draft change shows through the machine's drift.

    python -m benchmarks.speculative_engine --repository build/real/smollm2/models-fused \\
        --teacher smollm2-teacher --draft smollm2:3 --draft smollm2:4 \\
        --texts ../shared/data/wikitext2_raw_valid.txt --out docs/bench

Each `--draft NAME:VERSION` drafts with that student version's draft variant (its cut head where its export
wrote one; `NAME:VERSION:fp32` with the variant it answers with), through the service's own runners
(service.generation.speculative). A request is the prompt's prefill and greedy decoding to `--new-tokens`,
timed whole (the draft's catch-up prefill included); every drafted text must equal the teacher's alone. The
ratio is the teacher alone's time over the drafted one's, summed over all prompts and rounds.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from common.cli import cli_app
from common.progress import ProgressLog
from loadtests.texts import openings
from service.drafts import cut_head
from service.generation.runner import DecoderRunner
from service.generation.sampling import SamplingParams
from service.generation.scheduler import StepPlan
from service.generation.sequence import Sequence
from service.generation.speculative import SpeculativeRunner
from service.repository import ModelVersion, scan_repository
from service.runtime import ort_engine_factory
from service.settings import Settings
from service.tokenization import TextEncoder

console = Console(stderr=True)
app = cli_app(help=__doc__)


@dataclass
class Tally:
    seconds: float = 0.0
    tokens: int = 0
    teacher_steps: int = 0
    drafted: int = 0
    accepted: int = 0

    def row(self, name: str, alone: Tally) -> str:
        per_step = self.tokens / self.teacher_steps if self.teacher_steps else 1.0
        acceptance = f"{self.accepted / self.drafted:.3f}" if self.drafted else "-"
        return (
            f"| {name} | {1000 * self.seconds / self.tokens:.2f} | **{alone.seconds / self.seconds:.3f}x** | "
            f"{per_step:.2f} | {acceptance} | {self.drafted / self.tokens:.2f} |"
        )


def decode(
    runner: DecoderRunner | SpeculativeRunner, prompt: list[int], new_tokens: int, tally: Tally
) -> list[int]:
    """One request alone: prefill, then greedy steps until `new_tokens`; its time and counts into `tally`."""
    seq = Sequence(prompt=prompt, params=SamplingParams(max_new_tokens=new_tokens))
    started = time.perf_counter()
    plan = StepPlan(prefill=[seq], decode=[])
    while len(seq.output) < new_tokens:
        result = runner.execute(plan)
        seq.output += [result.tokens[seq.id], *result.more.get(seq.id, ())]
        tally.teacher_steps += 1 if plan.decode else 0
        tally.drafted, tally.accepted = tally.drafted + result.drafted, tally.accepted + result.accepted
        plan = StepPlan(prefill=[], decode=[seq])
    tally.seconds += time.perf_counter() - started
    tally.tokens += new_tokens - 1  # the decoded ones: the first comes from the prefill, drafted or not
    return seq.output[:new_tokens]


def version_of(versions: list[ModelVersion], ref: str) -> ModelVersion:
    """NAME (its newest version) or NAME:VERSION, found in the repository, else a usage error."""
    name, _, number = ref.partition(":")
    if number and not number.isdigit():
        raise typer.BadParameter(f"{ref!r}: NAME or NAME:VERSION, the version a number")
    found = [
        v for v in versions if v.manifest.name == name and (not number or v.manifest.version == int(number))
    ]
    if not found:
        raise typer.BadParameter(f"{ref!r}: no such model version in the repository")
    return max(found, key=lambda v: v.manifest.version)


@app.command()
def main(
    repository: Annotated[Path, typer.Option(help="Model repository holding the teacher and its students.")],
    teacher: Annotated[str, typer.Option(help="The teacher, NAME or NAME:VERSION (fp32).")],
    draft: Annotated[list[str], typer.Option(help="A student version drafting: NAME:VERSION[:VARIANT].")],
    texts: Annotated[Path, typer.Option(help="Prompts: 40-word openings of this text file's paragraphs.")],
    k: Annotated[int, typer.Option(min=1, help="Draft tokens a round, at most.")] = 5,
    confidence: Annotated[float, typer.Option(min=0.0, max=1.0, help="A round ends below it.")] = 0.4,
    prompts: Annotated[int, typer.Option(min=1, help="Prompts, each a request alone.")] = 12,
    words: Annotated[int, typer.Option(min=1, help="Words of each paragraph's opening a prompt takes.")] = 40,
    new_tokens: Annotated[int, typer.Option(min=2, help="Tokens a request.")] = 64,
    rounds: Annotated[int, typer.Option(min=1, help="Passes over the prompts.")] = 1,
    out: Annotated[Path, typer.Option(help="Directory of the report.")] = Path("docs/bench"),
) -> None:
    """The teacher alone and drafted by each draft, prompt by prompt, in one process."""
    versions = scan_repository(repository).versions
    settings = Settings.model_validate({"device": "cpu"})
    served = version_of(versions, teacher)
    layout = served.manifest.generation
    if layout is None:
        raise typer.BadParameter(f"{teacher!r} is not a generation model", param_hint="--teacher")
    teacher_runner = DecoderRunner(ort_engine_factory(served, "fp32", settings), layout)
    runners: dict[str, DecoderRunner | SpeculativeRunner] = {"teacher alone": teacher_runner}
    for ref in draft:
        parts = ref.split(":")
        if len(parts) not in (2, 3):
            raise typer.BadParameter(f"{ref!r}: NAME:VERSION or NAME:VERSION:VARIANT", param_hint="--draft")
        student = version_of(versions, ":".join(parts[:2]))
        chosen = parts[2] if len(parts) == 3 else "draft"
        if student.manifest.generation is None or chosen not in student.manifest.variants:
            raise typer.BadParameter(f"{ref!r}: not a generation model with a {chosen!r} variant")
        head = cut_head(student.manifest) if chosen == "draft" else None
        engine = ort_engine_factory(student, chosen, settings)
        drafting = DecoderRunner(engine, student.manifest.generation, head=head)
        window = served.manifest.max_sequence_length
        runners[ref] = SpeculativeRunner(teacher_runner, drafting, k, window, 0, confidence)
    encoder = TextEncoder(served.file(served.manifest.tokenizer.file), served.manifest.tokenizer)
    ids = [
        encoder.encode_untruncated(text).input_ids.tolist()
        for text in openings(texts, prompts, words, seed=11)
    ]
    tallies = {name: Tally() for name in runners}
    with ProgressLog.beside(console, "speculative engine", rounds * len(ids), unit="prompts") as progress:
        for _ in range(rounds):
            for prompt in ids:
                alone = decode(teacher_runner, prompt, new_tokens, tallies["teacher alone"])
                for name, runner in list(runners.items())[1:]:
                    if decode(runner, prompt, new_tokens, tallies[name]) != alone:
                        raise RuntimeError(f"{name}: a greedy text differs from the teacher's alone")
                progress.update(advance=1)
    header = (
        f"# Speculative decoding in-process: {served.manifest.name} v{served.manifest.version}\n\n"
        f"{rounds} round(s) of {len(ids)} openings of {texts.name}'s paragraphs, {new_tokens} tokens each, "
        f"greedy (every drafted text the teacher's); k = {k}, confidence {confidence}.\n\n"
        "| drafted by | ms a token | vs the teacher alone | tokens a teacher step | acceptance | draft "
        "tokens a token |\n|---|---|---|---|---|---|\n"
    )
    report = header + "\n".join(t.row(name, tallies["teacher alone"]) for name, t in tallies.items()) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    stem = f"speculative-engine-{served.manifest.name}"
    (out / f"{stem}.md").write_text(report, encoding="utf-8")
    (out / f"{stem}.json").write_text(json.dumps({n: vars(t) for n, t in tallies.items()}, indent=2) + "\n")
    print(report)


if __name__ == "__main__":
    app()
