"""A request whose client has gone is cancelled wherever its work is: queued, it never reaches the engine.

uvicorn does not cancel an app when a connection closes; it answers the app's next `receive()` with
`http.disconnect`. Under distilserve's own server (service.server) the connection itself cancels the
request's registered work when it drops (`GuardedHttpToolsProtocol`): nothing per request but two dict
entries. Elsewhere (another ASGI server, tests) one task per request waits on `receive()`, which, once the
body is read, can only bring the disconnect, and cancels the request's task (~50-100 us of event-loop CPU a
request on 2 cores, measured against the protocol's way). Either way a queued sequence leaves its batch
queue, a generated one leaves the running batch, and the request ends as 499 (nginx's "client closed
request"): nobody reads that answer, but the access log and the metrics say what happened instead of
counting a server error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope

T = TypeVar("T")

CANCELS = "distilserve.cancels_on_disconnect"  # set by a server whose connections cancel WORK themselves
WORK = "distilserve.work"  # the task a dropped connection cancels
GONE = "distilserve.client_gone"  # set before it does, so the task knows why it was cancelled


async def until_disconnect(scope: Scope, receive: Receive, work: Awaitable[T]) -> T:
    """Await `work` in this task; if the client disconnects first, cancel it and raise ClientDisconnect.

    Call it only once the request's body has been read."""
    if not scope.get(CANCELS):
        return await cancel_on_disconnect(receive, work)
    task = asyncio.current_task()
    assert task is not None
    scope[WORK] = task
    try:
        return await work
    except asyncio.CancelledError:
        if not scope.get(GONE):  # cancelled by someone else (shutdown): theirs to handle
            raise
        task.uncancel()
        raise ClientDisconnect("the client closed the connection before the answer") from None
    finally:
        scope.pop(WORK, None)


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
