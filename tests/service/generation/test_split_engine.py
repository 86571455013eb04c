"""A decoder served from its int4 and fp32 graphs together: each call goes to the graph its rows say, the
line between them is where int4 stops decoding faster (timed at start-up), and greedy text decoded across
both graphs is still PyTorch's."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import service.decoder_sessions
import service.generation.split_engine
from service.engine import Engine, OrtEngine
from service.generation.sampling import SamplingParams
from service.generation.split_engine import RowSplitEngine, narrow_rows
from service.metrics import Metrics
from service.repository import ModelVersion, read_version
from service.runtime import load_engine_model, ort_engine_factory
from service.settings import Settings
from service.tokenization import TextEncoder
from tests.service.generation.helpers import pytorch_greedy, together

PROMPTS = ["I loved this", "Acme was founded by John Smith in 1950", "Who", "The film was wonderful and"]


class Recording:
    """An engine that says which it is and records the rows of each call."""

    provider = "CPUExecutionProvider"

    def __init__(self) -> None:
        self.input_names = ["input_ids"]
        self.calls: list[int] = []

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append(feeds["input_ids"].size)
        return {}


def test_each_call_goes_to_the_graph_its_rows_say() -> None:
    narrow, wide = Recording(), Recording()
    split = RowSplitEngine(narrow, wide, rows=4)
    for shape in ((1, 1), (4, 1), (2, 2), (5, 1), (1, 30)):  # decode steps, a drafted check, prefills
        split.run({"input_ids": np.zeros(shape, np.int64)})
    assert narrow.calls == [1, 4, 4] and wide.calls == [5, 30]


@pytest.mark.parametrize(("faster_up_to", "expected"), [(0, 0), (1, 1), (4, 4), (8, 8), (16, 16)])
def test_the_line_is_the_most_rows_at_which_int4_is_still_faster(faster_up_to: int, expected: int) -> None:
    narrow, wide = Recording(), Recording()
    timed: list[tuple[str, int]] = []

    def time_step(engine: Engine, rows: int) -> float:
        timed.append(("narrow" if engine is narrow else "wide", rows))
        return (0.9 if rows <= faster_up_to else 1.1) if engine is narrow else 1.0

    assert narrow_rows(time_step, narrow, wide) == expected
    assert max(rows for _, rows in timed) == min(16, next((r for r in (1, 4, 8, 16) if r > expected), 16))


def test_greedy_decoded_across_both_graphs_is_pytorchs(q4_llama: tuple[Path, Path]) -> None:
    """Prompts decoded together and alone, with the line at one row: lone decode steps on int4, batched
    steps and every prefill on fp32, a sequence moving between them as others join and finish."""
    hf, exported = q4_llama
    version = read_version(exported)
    layout = version.manifest.generation
    assert layout is not None
    prompts, expected = pytorch_greedy(hf, PROMPTS, 16, layout.eos_token_id)
    int4 = OrtEngine(version.file("model.int4.onnx"), device="cpu")
    fp32 = OrtEngine(version.file("model.onnx"), device="cpu")
    split = RowSplitEngine(int4, fp32, rows=1)
    encoder = TextEncoder(version.file(version.manifest.tokenizer.file), version.manifest.tokenizer)
    with ThreadPoolExecutor(max_workers=1) as executor:
        served = (split, layout, encoder, executor)
        params = SamplingParams(max_new_tokens=16)
        assert together(served, prompts, params) == expected
        assert [together(served, [p], params)[0] for p in prompts] == expected


@pytest.mark.parametrize(
    ("faster_up_to", "engine", "variant"),
    [(16, "int4", "int4"), (4, "split", "int4"), (0, "fp32", "fp32")],
)
def test_the_engine_core_serves_int4_fp32_or_both_as_timed(
    q4_llama: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, faster_up_to: int, engine: str, variant: str
) -> None:
    version = read_version(q4_llama[1])
    built: dict[str, Engine] = {}

    def factory(v: ModelVersion, name: str, settings: Settings) -> Engine:
        built[name] = made = ort_engine_factory(v, name, settings)
        return made

    def step_s(timed: Engine, layout: object, rows: int, *args: object, **kwargs: object) -> float:
        if timed is built["fp32"]:
            return 1.0
        return 0.9 if rows <= faster_up_to else 1.1

    monkeypatch.setattr(service.decoder_sessions, "decode_step_s", lambda *a, **k: 1.0)  # threads: keep all
    monkeypatch.setattr(service.generation.split_engine, "decode_step_s", step_s)
    model = load_engine_model(version, Settings(device="cpu", intra_op_threads=2), Metrics(), factory)
    assert model.variant == variant and model.placement().variant == variant
    if engine == "split":
        assert isinstance(model.engine, RowSplitEngine) and model.engine.rows == faster_up_to
        assert (model.engine.narrow, model.engine.wide) == (built["int4"], built["fp32"])
    else:
        assert model.engine is built[engine]


def test_int4_named_or_without_warm_up_is_served_alone(q4_llama: tuple[Path, Path]) -> None:
    version = read_version(q4_llama[1])
    for settings in (Settings(device="cpu", variant="int4"), Settings(device="cpu", warmup=False)):
        model = load_engine_model(version, settings, Metrics(), ort_engine_factory)
        assert model.variant == "int4" and isinstance(model.engine, OrtEngine)
