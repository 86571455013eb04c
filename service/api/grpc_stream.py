"""ModelStreamInfer, Triton's decoupled streaming (tritonclient.grpc's `start_stream` and
`async_stream_infer`): every request on the stream runs as ModelInfer does, beside the others, and answers
in one or more responses: a generation prompt in the pieces its tokens come in (the task's
`V2Interface.stream`), anything else whole. A failed request is a response with its `error_message`; the
stream goes on. With the request parameter `triton_enable_empty_final_response`, each response says
`triton_final_response` false and an empty one saying true ends the request (Triton's convention). A client
that closes the stream cancels what it still runs. Each request is kept as service.api.grpc_v2 keeps any
(`serve`: keys, the drain gate, metrics, its span and access line)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from tritonclient.grpc import service_pb2

from service.api.grpc_v2_wire import Failure, infer_response, read_request
from service.api.v2 import as_classifications, find_model, loaded, v2_job
from service.exchange import Exchange
from service.tasks import TASKS

T = TypeVar("T")
Serve = Callable[..., Awaitable[tuple[Exchange, Any]]]  # InferenceServicer._serve


async def stream_infer(state: Any, serve: Serve, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
    """The stream's responses, in the order they are ready, until every request on it has ended."""
    out: asyncio.Queue[Any] = asyncio.Queue()
    running: set[asyncio.Task[None]] = set()

    async def read() -> None:
        async for request in request_iterator:
            task = asyncio.create_task(_one(state, serve, request, context, out.put_nowait))
            running.add(task)
            task.add_done_callback(running.discard)
        while running:
            await asyncio.wait(set(running))

    reader = asyncio.create_task(read())
    # the requests ended, or reading them failed or was cancelled: so is the stream
    reader.add_done_callback(lambda _: out.put_nowait(None))
    try:
        while (response := await out.get()) is not None:
            yield response
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()


async def _one(state: Any, serve: Serve, request: Any, context: Any, emit: Callable[[Any], None]) -> None:
    flagged = _bool_parameter(request, "triton_enable_empty_final_response")

    async def run(x: Exchange) -> None:
        c = loaded(state)
        model = find_model(c.registry, request.model_name, request.model_version or None)
        x.serve(model.name, model.manifest.task, model.stats)
        parsed, binary = read_request(request)
        job, choices = v2_job(c, model, parsed, binary, x, context.time_remaining())
        interface = TASKS[model.manifest.task].v2
        pieces = interface.stream(job) if interface.stream is not None else _whole(interface.run(job))
        async for tensors in pieces:
            response = infer_response(request.id, model, as_classifications(tensors, choices, model), choices)
            if flagged:
                response.parameters["triton_final_response"].bool_param = False
            emit(service_pb2.ModelStreamInferResponse(infer_response=response))

    _, outcome = await serve("ModelStreamInfer", context, run, work=True)
    if isinstance(outcome, Failure):  # tritonclient reads the message; the response names the request
        named = service_pb2.ModelInferResponse(id=request.id, model_name=request.model_name)
        emit(service_pb2.ModelStreamInferResponse(error_message=outcome.message, infer_response=named))
    if flagged:
        final = service_pb2.ModelInferResponse(id=request.id, model_name=request.model_name)
        final.parameters["triton_final_response"].bool_param = True
        emit(service_pb2.ModelStreamInferResponse(infer_response=final))


async def _whole(answer: Awaitable[T]) -> AsyncIterator[T]:
    yield await answer


def _bool_parameter(request: Any, name: str) -> bool:
    return name in request.parameters and request.parameters[name].bool_param
