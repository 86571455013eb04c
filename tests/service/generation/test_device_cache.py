"""The KV cache kept on the engine's device between decode steps (IO binding forced on, so the GPU's code
path runs on the CPU provider), on optimum's graphs (present = past + new) of a GPT-2 and of a Llama with
grouped-query attention: greedy output equals the host cache's and PyTorch's, alone and with sequences
joining and leaving mid-way; the cache never goes through the host: its rows are re-formed on the device
when they change, and only the joining rows' prefilled caches are uploaded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from service.engine import IoBinding, OrtEngine
from service.generation.device_cache import DeviceCache
from service.generation.runner import DecoderRunner, cache_device
from service.generation.sampling import SamplingParams
from service.generation.scheduler import StepPlan
from service.generation.sequence import Sequence
from service.repository import read_version
from tests.conftest import TASK_MODEL_NAMES
from tests.service.generation.helpers import PROMPTS


@pytest.fixture(scope="module")
def llama_optimum_repository(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny grouped-query Llama exported as optimum's decoder (present = past + new)."""
    import export.tasks
    from export.pipeline import export_model

    repository = tmp_path_factory.mktemp("llama-optimum")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export.tasks, "appends", lambda config: False)
        result = export_model(
            tiny_llama_dir, "text-generation", "llama", repository, ("fp32",), require_eval_data=False
        )
    assert result.version_dir is not None, [(r.variant, r.problems) for r in result.variants]
    return result.version_dir


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(
    request: pytest.FixtureRequest, tiny_models: dict[str, Path], tiny_llama_dir: Path
) -> Iterator[Any]:
    """(version directory, HF directory) of an optimum decoder graph."""
    if request.param == "gpt2":
        repository = request.getfixturevalue("optimum_lm_repository")
        yield repository / TASK_MODEL_NAMES["text-generation"] / "1", tiny_models["text-generation"]
    else:
        yield request.getfixturevalue("llama_optimum_repository"), tiny_llama_dir


def runner(version_dir: Path, io_binding: IoBinding) -> DecoderRunner:
    version = read_version(version_dir)
    layout = version.manifest.generation
    assert layout is not None and layout.present_positions == "all"
    return DecoderRunner(OrtEngine(version.file("model.onnx"), device="cpu", io_binding=io_binding), layout)


def prompt_ids(hf_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    return [tokenizer(text)["input_ids"] for text in PROMPTS[:6] * 2]


def churn(
    runner: DecoderRunner, prompts: list[list[int]], lengths: list[int], logits: list[list[Any]] | None = None
) -> tuple[list[list[int]], int]:
    """A sequence joins every other step and each leaves at its own length. Returns every output and the
    number of decode steps whose rows differed from the last decode's (the device cache's rebuilds); with
    `logits`, each sequence's decode logits are appended to its list there."""
    waiting = [Sequence(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, lengths, strict=True)]
    if logits is not None:
        record_logits(runner, {s.id: logits.append([]) or logits[-1] for s in waiting})
    everyone, running, step, changes, last = list(waiting), list[Sequence](), 0, 0, set[int]()
    while waiting or running:
        joining = [waiting.pop(0)] if waiting and step % 2 == 0 else []
        tokens = runner.execute(StepPlan(prefill=joining, decode=running)).tokens
        rows = {s.id for s in running}
        changes += bool(running) and rows != last
        last = rows
        for seq in [*joining, *running]:
            seq.output.append(tokens[seq.id])
        running = [s for s in [*running, *joining] if len(s.output) < s.params.max_new_tokens]
        step += 1
    return [s.output for s in everyone], changes


def record_logits(runner: DecoderRunner, into: dict[int, list[Any]]) -> None:
    """Each decode step's last-position logits, per sequence id (a spy on the runner's engine calls)."""
    run = runner._run

    def spy(ids: Any, mask: Any, positions: Any, past: Any, on_device: bool = False, **picks: Any) -> Any:
        outputs = run(ids, mask, positions, past, on_device, **picks)
        if mask.shape[1] > ids.shape[1]:  # a decode step: the mask covers the past too
            assert runner._cache is not None
            for seq_id, row in zip(runner._cache.ids, outputs["logits"][:, -1], strict=True):
                if seq_id in into:  # not a later run's sequence
                    into[seq_id].append(row.copy())
        return outputs

    runner._run = spy  # type: ignore[method-assign]


def until_eos(tokens: list[int], eos: int | None) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def test_binding_forced_on_keeps_the_cache_on_the_device_and_auto_does_not_on_a_cpu(model: Any) -> None:
    version_dir, _ = model
    assert isinstance(runner(version_dir, "on")._new_cache(), DeviceCache)
    for setting in ("auto", "off"):
        assert cache_device(runner(version_dir, setting).engine, runner(version_dir, setting).layout) is None


def test_greedy_on_the_device_equals_the_host_cache_and_pytorch_with_joins_and_leaves(model: Any) -> None:
    from transformers import AutoModelForCausalLM

    from export.greedy import greedy_torch

    version_dir, hf_dir = model
    prompts = prompt_ids(hf_dir)
    lengths = [5 + (7 * i) % 11 for i in range(len(prompts))]  # 5..15 new tokens, all different neighbours
    on_device = runner(version_dir, "on")
    device_logits: list[list[Any]] = []
    host_logits: list[list[Any]] = []
    together, changes = churn(on_device, prompts, lengths, device_logits)
    assert together == churn(runner(version_dir, "off"), prompts, lengths, host_logits)[0]
    # The untrained models repeat tokens whatever the cache holds: their logits tell rows apart.
    for device_rows, host_rows in zip(device_logits, host_logits, strict=True):
        np.testing.assert_allclose(np.array(device_rows), np.array(host_rows), rtol=1e-4, atol=1e-5)
    assert on_device.row_gather is not None and on_device.row_gather.rebuilds == changes
    alone = [churn(on_device, [p], [n])[0][0] for p, n in zip(prompts, lengths, strict=True)]
    assert alone == together
    torch_model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    eos = on_device.layout.eos_token_id
    expected = [greedy_torch(torch_model, p, n, eos) for p, n in zip(prompts, lengths, strict=True)]
    assert [until_eos(out, eos) for out in together] == expected


def test_the_appending_graph_keeps_its_host_cache_with_binding_on(tiny_repository: Path) -> None:
    """distilserve's appending graph returns only the new position: binding on binds its inputs and
    outputs, the cache stays the host's, and its output is the same as without binding."""
    version = read_version(tiny_repository / TASK_MODEL_NAMES["text-generation"] / "1")
    layout = version.manifest.generation
    assert layout is not None and layout.present_positions == "new"
    runners = [
        DecoderRunner(OrtEngine(version.file("model.onnx"), device="cpu", io_binding=b), layout)
        for b in ("on", "off")
    ]
    assert cache_device(runners[0].engine, layout) is None
    prompts, lengths = [[5, 6, 7], [8, 9], [10, 11, 12, 13]] * 2, [4, 9, 6, 3, 7, 5]
    assert churn(runners[0], prompts, lengths)[0] == churn(runners[1], prompts, lengths)[0]


def test_a_decode_step_feeds_the_cache_from_the_device_and_keeps_its_presents_there(model: Any) -> None:
    """What crosses to the device in a decode step: ids, mask and position ids; the past goes in as the
    last step's OrtValues and the presents stay as OrtValues (a spy on the engine's bound calls)."""
    version_dir, hf_dir = model
    on_device = runner(version_dir, "on")
    engine, calls = on_device.engine, []
    run_bound = engine.run_bound  # type: ignore[attr-defined]

    def spy(feeds: dict[str, Any], keep: Any = ()) -> dict[str, Any]:
        outputs = run_bound(feeds, keep)
        if keep:  # a decode step (a prefill is run plainly, its presents wanted on the host)
            calls.append(({k: type(v) for k, v in feeds.items()}, {k: type(v) for k, v in outputs.items()}))
        return outputs

    engine.run_bound = spy  # type: ignore[attr-defined]
    prompts = prompt_ids(hf_dir)[:4]
    churn(on_device, prompts, [6, 3, 8, 5])
    assert len(calls) >= 7  # every decode step (the longest alone has 7 after its prefill)
    for inputs, outputs in calls:
        assert {k for k, t in inputs.items() if t is not ort.OrtValue} == {
            "input_ids",
            "attention_mask",
            "position_ids",
        }
        assert {k for k, t in outputs.items() if t is not ort.OrtValue} == {"logits"}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_row_graph_is_valid_onnx_and_gathers_crops_pads_and_stacks_rows(dtype: type) -> None:
    import onnx

    from service.generation.row_graph import row_graph

    model = row_graph(np.dtype(dtype), 3)
    onnx.checker.check_model(onnx.load_from_string(model), full_check=True)
    gather = OrtEngine(model, device="cpu", io_binding="on")
    rng = np.random.default_rng(0)
    caches = [rng.standard_normal((3, 2, 5, 4)).astype(dtype) for _ in range(3)]
    cases = [  # keep, crop, pad, joining rows
        ([2, 0], 0, 2, 1),  # a longer row joins: the others gain zero columns on the left
        ([1], 2, 0, 2),  # the longest left: the others lose the columns only it used
        ([0, 1, 2], 0, 0, 1),
        ([1, 0], 0, 0, 0),  # only leaves (and a new order)
    ]
    for keep, crop, pad, joining in cases:
        rows = np.array(keep, dtype=np.int64)
        new = [rng.standard_normal((joining, 2, 5 - crop + pad, 4)).astype(dtype) for _ in caches]
        feeds: dict[str, Any] = {
            "keep": rows,
            "start": np.array([crop]),
            "end": np.array([5]),
            "axes": np.array([2]),
            "pads": np.array([0, 0, pad, 0, 0, 0, 0, 0]),
        }
        for i, (cache, array) in enumerate(zip(caches, new, strict=True)):
            feeds[f"cache.{i}"], feeds[f"new.{i}"] = gather.to_device(cache), array
        outputs = gather.run_bound(feeds, keep={"out.0", "out.1", "out.2"})
        for i, (cache, array) in enumerate(zip(caches, new, strict=True)):
            aligned = np.pad(cache[rows][:, :, crop:], ((0, 0), (0, 0), (pad, 0), (0, 0)))
            np.testing.assert_array_equal(outputs[f"out.{i}"].numpy(), np.concatenate([aligned, array]))
