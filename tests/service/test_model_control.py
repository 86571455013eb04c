"""Model versions loaded and retired without a restart (service.model_control), in one process: under `poll`
a new version takes over and the old one is unloaded, a broken one is reported and never served, a removed
one rolls back; under `explicit` load and unload answer, elsewhere they are refused with the reason."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from service.client import RemoteEngine
from service.engine import Engine, EngineError
from service.ipc import Placement
from service.metrics import Metrics
from service.model_control import ModelRetiredError
from service.remote_models import RemoteEncoder
from service.repository import ModelVersion, read_version
from service.runtime import ort_engine_factory
from service.served import ServedModel, text_encoder
from service.settings import Settings
from tests.service.test_app import metric_value, serve

CLS = "tiny-cls"
INFER = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a fine film"]}]}


def add_version(repository: Path, name: str, version: int, *, corrupt: str | None = None) -> Path:
    """`name`'s version 1 copied as `version`, written beside and renamed in as the export does.
    corrupt="file": the model's bytes change (its checksum no longer matches); "graph": the bytes and
    the manifest's checksum change together (it validates, and ONNX Runtime cannot load it)."""
    staging = repository / name / f".staging-{version}"
    shutil.copytree(repository / name / "1", staging)
    manifest = json.loads((staging / "manifest.json").read_text())
    manifest["version"] = version
    if corrupt is not None:
        onnx = staging / manifest["variants"]["fp32"]["file"]
        original = onnx.read_bytes()
        onnx.write_bytes(b"not an onnx graph" + original[17:])  # the same size, other bytes
        if corrupt == "graph":
            from common.provenance import sha256_of

            manifest["variants"]["fp32"]["sha256"] = sha256_of(onnx)
            manifest["variants"]["fp32"]["size_bytes"] = onnx.stat().st_size
    (staging / "manifest.json").write_text(json.dumps(manifest))
    final = repository / name / str(version)
    staging.rename(final)
    return final


@pytest.fixture
def repository(tmp_path: Path, tiny_repository: Path) -> Path:
    """tiny-cls version 1 alone."""
    shutil.copytree(tiny_repository / CLS, tmp_path / "models" / CLS)
    return tmp_path / "models"


def control_settings(repository: Path, mode: str) -> Settings:
    return Settings(model_repository=repository, model_control=mode, repository_poll_s=0.1, device="cpu")  # type: ignore[arg-type]


def run(
    settings: Settings, body: Callable[[httpx.AsyncClient], Awaitable[Any]], engine_factory: Any = None
) -> Any:
    async def main() -> Any:
        async for client in serve(settings, engine_factory or ort_engine_factory):
            return await body(client)

    return asyncio.run(main())


async def index(client: httpx.AsyncClient) -> dict[tuple[str, str], dict[str, str]]:
    r = await client.post("/v2/repository/index")
    assert r.status_code == 200, r.text
    return {(e["name"], e["version"]): e for e in r.json()}


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "not within the time allowed"
        await asyncio.sleep(0.05)


async def answering_version(client: httpx.AsyncClient) -> str:
    r = await client.post(f"/v2/models/{CLS}/infer", json=INFER)
    assert r.status_code == 200, r.text
    return str(r.json()["model_version"])


def test_poll_switches_to_a_new_version_without_a_failed_request(repository: Path) -> None:
    async def body(client: httpx.AsyncClient) -> None:
        statuses: list[int] = []
        stop = asyncio.Event()

        async def load() -> None:
            while not stop.is_set():
                r = await client.post("/v1/classify", json={"inputs": ["a fine film"]})
                statuses.append(r.status_code)

        clients = [asyncio.create_task(load()) for _ in range(4)]
        await asyncio.sleep(0.2)
        add_version(repository, CLS, 2)

        async def serves_2() -> bool:
            return await answering_version(client) == "2"

        await until(serves_2)
        found = await index(client)
        await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*clients)
        assert statuses and set(statuses) == {200}, sorted(set(statuses))
        assert found[(CLS, "2")]["state"] == "READY"
        assert found[(CLS, "1")]["state"] in ("UNLOADING", "UNAVAILABLE")
        assert "superseded by version 2" in found[(CLS, "1")]["reason"]
        r = await client.get(f"/v2/models/{CLS}/versions/1/ready")
        assert r.status_code in (400, 404)
        config = (await client.get(f"/v2/models/{CLS}/config")).json()
        assert config["version_policy"] == {"latest": {"num_versions": 1}}

    run(control_settings(repository, "poll"), body)


@pytest.mark.parametrize(
    ("corrupt", "reason"), [("file", "sha256 does not match"), ("graph", "onnx")], ids=["checksum", "graph"]
)
def test_poll_reports_a_broken_version_and_keeps_serving(repository: Path, corrupt: str, reason: str) -> None:
    async def body(client: httpx.AsyncClient) -> None:
        add_version(repository, CLS, 2, corrupt=corrupt)

        async def reported() -> bool:
            row = (await index(client)).get((CLS, "2"))
            return row is not None and row["state"] == "UNAVAILABLE"

        await until(reported)
        row = (await index(client))[(CLS, "2")]
        assert reason in row["reason"].lower(), row
        assert (await index(client))[(CLS, "1")]["state"] == "READY"
        assert await answering_version(client) == "1"
        ready = await client.post("/v2/repository/index", json={"ready": True})
        assert [(e["name"], e["version"]) for e in ready.json()] == [(CLS, "1")]
        metrics = (await client.get("/metrics")).text
        assert metric_value(metrics, "distilserve_model_loads_total", model=CLS, outcome="failed") == 1
        assert metric_value(metrics, "distilserve_model_loads_total", model=CLS, outcome="ready") == 1

    run(control_settings(repository, "poll"), body)


def test_poll_rolls_back_when_the_served_version_is_removed(repository: Path) -> None:
    add_version(repository, CLS, 2)

    async def body(client: httpx.AsyncClient) -> None:
        assert await answering_version(client) == "2"
        assert (await index(client))[(CLS, "1")]["reason"] == "superseded by version 2"
        shutil.rmtree(repository / CLS / "2")

        async def serves_1() -> bool:
            return await answering_version(client) == "1"

        async def forgotten() -> bool:  # (the index forgets it once the sync that retired it ends)
            return (CLS, "2") not in await index(client)

        await until(serves_1)
        await until(forgotten)

    run(control_settings(repository, "poll"), body)


def test_explicit_unload_then_load(repository: Path) -> None:
    async def body(client: httpx.AsyncClient) -> None:
        assert (await client.post(f"/v2/repository/models/{CLS}/unload")).status_code == 200
        r = await client.post("/v1/classify", json={"inputs": ["a fine film"]})
        assert r.status_code == 404, r.text
        assert (await index(client))[(CLS, "1")] == {
            "name": CLS,
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "unloaded",
        }
        add_version(repository, CLS, 2)  # explicit: nothing happens until asked
        await asyncio.sleep(0.3)
        assert (await index(client)).get((CLS, "2")) is None
        assert (await client.post(f"/v2/repository/models/{CLS}/load")).status_code == 200
        assert await answering_version(client) == "2"
        missing = await client.post("/v2/repository/models/nothing-here/load")
        assert missing.status_code == 404 and "nothing-here" in missing.json()["error"]
        again = await client.post("/v2/repository/models/nothing-here/unload")
        assert again.status_code == 404
        for outside in ("..", ".hidden", "%2E%2E"):  # the repository's parent, an export in progress
            r = await client.post(f"/v2/repository/models/{outside}/load")
            assert r.status_code == 404, (outside, r.text)

    run(control_settings(repository, "explicit"), body)


def test_explicit_load_of_a_broken_version_says_why(repository: Path) -> None:
    async def body(client: httpx.AsyncClient) -> None:
        assert (await client.post(f"/v2/repository/models/{CLS}/unload")).status_code == 200
        add_version(repository, CLS, 2, corrupt="graph")
        shutil.rmtree(repository / CLS / "1")
        r = await client.post(f"/v2/repository/models/{CLS}/load")
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error.startswith(f"failed to load '{CLS}'") and "2/model.onnx" in error, error
        assert (await index(client))[(CLS, "2")]["state"] == "UNAVAILABLE"

    run(control_settings(repository, "explicit"), body)


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_load_and_unload_are_refused_outside_explicit_with_the_reason(repository: Path, mode: str) -> None:
    async def body(client: httpx.AsyncClient) -> None:
        for action in ("load", "unload"):
            r = await client.post(f"/v2/repository/models/{CLS}/{action}")
            assert r.status_code == 400, r.text
            assert f"DISTILSERVE_MODEL_CONTROL={mode}" in r.json()["error"]
        assert await answering_version(client) == "1"

    run(control_settings(repository, mode), body)


def test_none_serves_every_version_and_lists_broken_ones(repository: Path) -> None:
    add_version(repository, CLS, 2)
    add_version(repository, CLS, 3, corrupt="file")

    async def body(client: httpx.AsyncClient) -> None:
        found = await index(client)
        assert [found[(CLS, v)]["state"] for v in ("1", "2", "3")] == ["READY", "READY", "UNAVAILABLE"]
        assert "sha256" in found[(CLS, "3")]["reason"]
        r = await client.post(f"/v2/models/{CLS}/versions/1/infer", json=INFER)
        assert r.status_code == 200 and r.json()["model_version"] == "1"
        assert await answering_version(client) == "2"

    run(control_settings(repository, "none"), body)


class FailsToRun:
    """A session that loads but whose every run fails: what a broken graph or device looks like at warm-up."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def provider(self) -> str:
        return self.engine.provider

    @property
    def input_names(self) -> list[str]:
        return self.engine.input_names

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise EngineError("the device went away")


def test_a_version_that_fails_its_warm_up_never_takes_traffic(repository: Path) -> None:
    def factory(version: ModelVersion, variant: str, settings: Settings) -> Engine:
        engine = ort_engine_factory(version, variant, settings)
        return FailsToRun(engine) if version.version == 2 else engine

    async def body(client: httpx.AsyncClient) -> None:
        add_version(repository, CLS, 2)

        async def reported() -> bool:
            row = (await index(client)).get((CLS, "2"))
            return row is not None and row["state"] == "UNAVAILABLE"

        await until(reported)
        row = (await index(client))[(CLS, "2")]
        assert "warm-up failed: the device went away" in row["reason"], row
        assert await answering_version(client) == "1"

    run(control_settings(repository, "poll"), body, factory)


def test_a_request_sent_to_a_retired_version_is_answered_by_its_compatible_successor(
    repository: Path,
) -> None:
    """A request that chose v1, then reached the core after v1 was unloaded (a cascade's teacher chosen before
    its student answered): v2, the same tokenizer, labels and outputs, answers it; a v2 with other labels
    cannot, and the request gets the 503 whose retry finds v2."""
    add_version(repository, CLS, 2)
    engine = RemoteEngine(
        Settings(model_repository=repository, engine_address="unix:/nonexistent"), Metrics()
    )
    sent: list[tuple[str, int]] = []

    def view(version: int) -> ServedModel:
        served = read_version(repository / CLS / str(version))
        placement = Placement(CLS, version, "fp32", "cpu", 1, 1, 8)
        model = ServedModel(served, text_encoder(served), placement)
        encoder = RemoteEncoder(engine, served.manifest)

        async def answer(*args: Any) -> Any:
            sent.append((CLS, version))
            if version == 1:
                raise ModelRetiredError("model 'tiny-cls' version 1 was unloaded; retry")
            return [{"logits": np.zeros(2)}]

        encoder._run = answer  # type: ignore[method-assign]  # the core's answer, without a core
        model.encoding = encoder
        return model

    old, new = view(1), view(2)
    engine._views = {(CLS, 2): new}  # the frontend routes to v2 now
    assert old.encoding is not None
    answered = asyncio.run(old.encoding.run([], 1.0, []))
    assert sent == [(CLS, 1), (CLS, 2)] and len(answered) == 1

    relabelled = new.manifest.model_copy(update={"labels": {0: "no", 1: "yes"}})
    new.version = new.version.__class__(manifest=relabelled, directory=new.version.directory)
    sent.clear()
    with pytest.raises(ModelRetiredError):
        asyncio.run(old.encoding.run([], 1.0, []))
    assert sent == [(CLS, 1)]
