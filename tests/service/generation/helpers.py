"""What the engine tests share: prompts, a generation engine over a decoder graph's parts, one run alone."""

from __future__ import annotations

import asyncio
from typing import Any

from common.logit_positions import LOGIT_POSITIONS
from service.generation.engine import GenerationEngine
from service.generation.grammar import Grammars
from service.generation.runner import DecoderRunner
from service.generation.sampling import SamplingParams
from service.generation.scheduler import Scheduler, SchedulerConfig

PROMPTS = [
    "Acme",
    "I loved this film, it was",
    "Who founded Acme? When was it founded?",
    "A dull",
    "Springfield is a city",
    "The film was wonderful and the music",
    "Who",
    "When was Acme founded by John Smith in the city",
]


def make_engine(
    parts: tuple[Any, ...], max_running: int = 16, eos: int | None = -1, grammars: Grammars | None = None
) -> GenerationEngine:
    engine, layout, encoder, executor = parts
    return GenerationEngine(
        DecoderRunner(engine, layout),
        Scheduler(SchedulerConfig(max_running=max_running)),
        encoder.text_stream,
        layout.eos_token_id if eos == -1 else eos,
        executor,
        grammars=grammars,
    )


def ids(parts: tuple[Any, ...], text: str) -> list[int]:
    return [int(t) for t in parts[2].encode([text])[0].input_ids]


def together(
    parts: tuple[Any, ...], prompts: list[list[int]], params: SamplingParams, max_running: int = 8
) -> list[list[int]]:
    """Each prompt submitted once the one before has a few tokens: they join a running batch at different
    steps. The engine is closed whatever happens (a running engine thread would hold the executor)."""

    async def main() -> list[list[int]]:
        engine = make_engine(parts, max_running=max_running)
        engine.start()
        try:
            sequences = []
            for prompt in prompts:
                sequences.append(engine.submit(prompt, params))
                while len(sequences[-1].output) < 3 and not sequences[-1].done:
                    await asyncio.sleep(0.001)
            for seq in sequences:
                async for _ in engine.stream(seq):
                    pass
        finally:
            await engine.close()
        return [seq.output for seq in sequences]

    return asyncio.run(asyncio.wait_for(main(), 60))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def alone(
    parts: tuple[Any, ...], prompt: list[int], params: SamplingParams, grammars: Grammars | None = None
) -> list[int]:
    async def main() -> list[int]:
        engine = make_engine(parts, grammars=grammars)
        engine.start()
        seq, _ = await engine.generate(prompt, params)
        await engine.close()
        return seq.output

    return run(main())


class CallLog:
    """An engine that logs each call's input width (columns of `input_ids`) and the positions it asked
    logits of (`logit_positions`, None where not fed), and otherwise runs as it is."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.input_names = engine.input_names
        self.widths: list[int] = []
        self.picked: list[Any] = []

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        self.widths.append(int(feeds["input_ids"].shape[1]))
        self.picked.append(feeds.get(LOGIT_POSITIONS))
        return self.engine.run(feeds)


def error(r: Any) -> str:
    """The refusal's message, from either shape: ours (422, "validation"), or OpenAI's on /v1/completions
    (400, "invalid_request_error", as OpenAI and vLLM answer)."""
    body = r.json()
    if isinstance(body["error"], dict):
        assert r.status_code == 400, r.text
        assert body["error"]["type"] == "invalid_request_error", body
        return str(body["error"]["message"])
    assert r.status_code == 422, r.text
    assert body["error_type"] == "validation", body
    return str(body["error"])


def pytorch_greedy(
    hf_dir: Any, texts: list[str], new_tokens: int, eos: int | None
) -> tuple[list[list[int]], list[list[int]]]:
    """The texts' prompt ids under the HF directory's tokenizer, and PyTorch's greedy continuation of each:
    the reference a served decoder's greedy text is held to."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from export.greedy import greedy_torch

    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    prompts = [tokenizer(text)["input_ids"] for text in texts]
    return prompts, [greedy_torch(model, p, new_tokens, eos) for p in prompts]
