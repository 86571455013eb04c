"""A request whose client has gone is cancelled wherever its work is: queued, it never reaches the engine.

uvicorn does not cancel an app when a connection closes; it answers the app's next `receive()` with
`http.disconnect`. Once a request's body is read nothing else can arrive, so one task waiting on
`receive()` hears of the disconnect the moment it happens and cancels the request's own task: a queued
sequence leaves its batch queue, a generated one leaves the running batch. The request then ends as 499
(nginx's "client closed request"): nobody reads that answer, but the access log and the metrics say what
happened instead of counting a server error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import ClientDisconnect
from starlette.types import Receive

T = TypeVar("T")


async def cancel_on_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work` in this task; if the client disconnects first, cancel it and raise ClientDisconnect.

    Call it only once the request's body has been read, so the only message left is the disconnect."""
    request_task = asyncio.current_task()
    assert request_task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        request_task.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:  # cancelled by someone else (shutdown): theirs to handle
            raise
        request_task.uncancel()
        raise ClientDisconnect("the client closed the connection before the answer") from None
    finally:
        watcher.cancel()
