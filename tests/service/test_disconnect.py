"""A client that goes away: its queued work is dropped before compute, and the request ends as a 499."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.requests import ClientDisconnect
from starlette.types import Message

from service.api.disconnect import cancel_on_disconnect
from tests.service.slow_server import running_slow_server, wait_for

GONE = 4


def receive_disconnect_after(delay_s: float | None) -> tuple[list[int], object]:
    """A `receive` whose only message is the disconnect, after `delay_s` (None: never); counts calls."""
    calls: list[int] = []

    async def receive() -> Message:
        calls.append(1)
        await asyncio.sleep(3600 if delay_s is None else delay_s)
        return {"type": "http.disconnect"}

    return calls, receive


def test_work_is_cancelled_when_the_client_goes_away() -> None:
    cancelled = asyncio.Event()

    async def work() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "done"

    async def main() -> None:
        _, receive = receive_disconnect_after(0.05)
        with pytest.raises(ClientDisconnect):
            await cancel_on_disconnect(receive, work())  # type: ignore[arg-type]
        assert cancelled.is_set()
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0  # the task goes on, e.g. to log it
        await asyncio.sleep(0)

    asyncio.run(asyncio.wait_for(main(), 5))


def test_work_that_ends_first_is_returned_and_the_watcher_stops() -> None:
    async def main() -> None:
        calls, receive = receive_disconnect_after(None)
        assert await cancel_on_disconnect(receive, asyncio.sleep(0.01, result="done")) == "done"  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        assert len(calls) == 1 and len(asyncio.all_tasks()) == 1  # no watcher left behind

    asyncio.run(main())


def test_a_cancellation_from_elsewhere_still_cancels() -> None:
    async def main() -> None:
        _, receive = receive_disconnect_after(None)
        task = asyncio.ensure_future(cancel_on_disconnect(receive, asyncio.sleep(10)))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


@pytest.fixture
def one_slow_instance(tiny_repository: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The real entry point with one engine call at a time, each 0.4 s, one sequence per batch."""
    env = {"SLOW_ENGINE_S": "0.4", "DISTILSERVE_MAX_BATCH_SIZE": "1", "DISTILSERVE_INSTANCES": "1"}
    with running_slow_server(tiny_repository, env) as server:
        yield server


def metric(metrics: str, name: str, label: str = "") -> float:
    """The sum of a metric's series (those with `label` in their labels, when given)."""
    lines = [x for x in metrics.splitlines() if x.startswith(f"{name}{{") or x.startswith(f"{name} ")]
    return sum(float(x.split()[-1]) for x in lines if label in x)


def post_and_hang_up(port: int, body: bytes, declared: int | None = None) -> None:
    """Send a request (or, declaring more bytes than sent, part of one) and close the connection."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        head = "POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        length = len(body) if declared is None else declared
        s.sendall(f"{head}Content-Length: {length}\r\n\r\n".encode() + body)
        time.sleep(0.05)  # read and queued behind the engine's current call


def test_queued_requests_of_clients_that_left_are_never_computed(
    one_slow_instance: tuple[str, subprocess.Popen[str]],
) -> None:
    base, process = one_slow_instance
    port = int(base.rsplit(":", 1)[1])
    with httpx.Client(base_url=base, timeout=30) as client:

        async def occupy_engine_and_leave() -> httpx.Response:
            async with httpx.AsyncClient(base_url=base, timeout=30) as a:
                stays = asyncio.ensure_future(a.post("/v1/classify", json={"inputs": "the one that stays"}))
                await asyncio.sleep(0.1)  # its 0.4 s engine call has begun
                for i in range(GONE - 1):
                    body = json.dumps({"inputs": f"gone {i}"}).encode()
                    await asyncio.to_thread(post_and_hang_up, port, body)
                await asyncio.to_thread(post_and_hang_up, port, b'{"inputs": "cut sh', 100)
                return await stays

        assert asyncio.run(occupy_engine_and_leave()).status_code == 200
        wait_for(lambda: metric(client.get("/metrics").text, "distilserve_requests_in_flight") == 0, 10)
        metrics = client.get("/metrics").text

    assert metric(metrics, "distilserve_requests_total", 'status="499"') == GONE
    assert metric(metrics, "distilserve_batch_size_count") == 1  # only the request that stayed ran
    assert metric(metrics, "distilserve_queue_depth") == 0
    process.terminate()
    output, _ = process.communicate(timeout=30)
    assert "Exception in ASGI application" not in output and "Traceback" not in output
    access = [json.loads(x) for x in output.splitlines() if x.startswith("{")]
    gone = [a for a in access if a["status"] == 499]
    assert len(gone) == GONE and all(a["inference_ms"] is None for a in gone)
