"""The request-body cap (pure ASGI): 413 before a byte of an oversized body is parsed.

A declared Content-Length over the cap is refused without reading the body at all; a chunked body is
counted as it streams in, and reading stops at the first byte over the cap.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import PayloadTooLargeError, response_for


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit():
            if int(declared) > self.max_bytes:
                await self._refuse(self._too_large(f"is {int(declared)} bytes,"), scope, receive, send)
                return
            # uvicorn hands the app at most the declared length (its parser frames the body by it), so
            # there is nothing to count: skip the two wrappers, a tenth of this stack's time per request.
            await self.app(scope, receive, send)
            return

        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self._too_large("is")
            return message

        async def watching_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, watching_send)
        except PayloadTooLargeError as e:  # a read outside a route; a route's own read is answered there
            if started:
                raise
            await self._refuse(e, scope, receive, send)

    def _too_large(self, how: str) -> PayloadTooLargeError:
        return PayloadTooLargeError(f"the request body {how} over the limit of {self.max_bytes} bytes")

    @staticmethod
    async def _refuse(error: PayloadTooLargeError, scope: Scope, receive: Receive, send: Send) -> None:
        response = response_for(error, scope["path"])
        assert response is not None
        await response(scope, receive, send)
