"""The engine core: one process per device that owns the ONNX Runtime sessions and batches every frontend's
requests together.

Frontends (service.client) connect to this process's Unix socket and send plain-data messages
(service.ipc): a request's token ids in, its outputs or generated tokens out. Each model has one
micro-batcher or generation core here, so requests from all frontends meet in the same batches, and a model
is loaded once per device, not once per frontend. Work whose client went away is dropped on `Abort`; work
whose deadline passed is dropped before compute, as in one process.

The socket is bound only once every model is loaded and warm: frontends, which keep trying to connect, see
a core exactly when it can answer. A frontend whose connection ends (it died) has its work dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from service import ipc
from service.batch_items import Ticket
from service.batch_policy import (
    BatcherClosedError,
    DeadlineExceededError,
    ItemTiming,
    QueueFullError,
    QueueTooSmallError,
)
from service.batching import MicroBatcher
from service.engine import EngineError
from service.engine_plan import EngineFactory
from service.generation.engine_thread import Produced
from service.generation.sequence import Sequence as GenSequence
from service.memory import resident_bytes
from service.metrics import Metrics
from service.model_control import ModelControl, ModelControlError, ModelRetiredError
from service.runtime import EngineModel
from service.settings import Settings
from service.startup import StartupClock
from service.tokenization import EncodedText
from service.tracing import setup_tracing

log = logging.getLogger(__name__)

Batcher = MicroBatcher[EncodedText, dict[str, np.ndarray]]


def failure(request_id: int, e: BaseException) -> ipc.Failed:
    """An exception as the frontend re-raises it (service.client.error_from)."""
    if isinstance(e, ModelRetiredError):
        return ipc.Failed(request_id, "retired", str(e))
    if isinstance(e, ModelControlError):
        return ipc.Failed(request_id, "control", str(e))
    if isinstance(e, QueueFullError):
        return ipc.Failed(request_id, "queue_full", str(e), e.retry_after_s)
    if isinstance(e, DeadlineExceededError):
        return ipc.Failed(request_id, "deadline", str(e))
    if isinstance(e, BatcherClosedError):
        return ipc.Failed(request_id, "closed", str(e))
    if isinstance(e, QueueTooSmallError):
        return ipc.Failed(request_id, "too_large", str(e))
    if isinstance(e, ValueError):
        return ipc.Failed(request_id, "invalid", str(e))
    if isinstance(e, LookupError):
        return ipc.Failed(request_id, "not_found", str(e))
    if not isinstance(e, EngineError):
        log.error("engine core: request %d failed", request_id, exc_info=e)
    return ipc.Failed(request_id, "engine", str(e))


@dataclass(frozen=True)
class Stream:
    """A generation request as the core knows it: whose it is, under which id."""

    peer: ipc.Channel
    request_id: int


class RowsRequest:
    """One `Encode`'s rows in its model's batcher: answered once, when the last row is done, or failed
    once, when one fails (the others then leave the queue: all or none)."""

    def __init__(
        self, core: EngineCore, peer: ipc.Channel, message: ipc.Encode, batcher: Batcher, rows: int
    ) -> None:
        self.core, self.peer, self.message, self.batcher = core, peer, message, batcher
        self.arrived = time.perf_counter()
        self.results: list[dict[str, np.ndarray] | None] = [None] * rows
        self.timings = [ItemTiming(traced=message.traced) for _ in range(rows)]
        self.tickets: list[Ticket[dict[str, np.ndarray]]] = []
        self.left = rows
        self.finished = False

    def queue(self, rows: list[EncodedText]) -> None:
        try:
            for i, row in enumerate(rows):
                ticket = self.batcher.enqueue(
                    row,
                    functools.partial(self._row_done, i),
                    self.message.timeout_s,
                    self.timings[i],
                    self.message.shadow,
                    self.message.priority,
                )
                self.tickets.append(ticket)
        except BaseException:
            self.abort()
            raise

    def _row_done(self, i: int, result: dict[str, np.ndarray] | None, error: BaseException | None) -> None:
        if self.finished:
            return
        if error is not None:
            self.abort()
            self.core._answered(self.peer, self.message.id, ipc.pack(failure(self.message.id, error)))
            return
        self.results[i] = result
        self.left -= 1
        if self.left:
            return
        self.finished = True
        t = self.timings
        frames = ipc.encode_outputs(
            self.message.id,
            self.results,  # type: ignore[arg-type]  # every row is filled once none is left
            [x.queue_s or 0.0 for x in t],
            [x.run_s or 0.0 for x in t],
            [-1 if x.batch is None else x.batch for x in t],
            time.perf_counter() - self.arrived,
            [x.batch_span for x in t] if self.message.traced else None,  # the links of a sampled request
        )
        self.core._answered(self.peer, self.message.id, frames)

    def abort(self) -> None:
        """Nobody waits any more: the rows still queued leave before compute."""
        self.finished = True
        for ticket in self.tickets:
            self.batcher.withdraw(ticket)


class EngineCore:
    """The models of this device behind one Unix socket: frontends' messages in, their answers out."""

    def __init__(self, control: ModelControl, ack_timeout_s: float = 30.0) -> None:
        self.control = control
        self.models = control.models  # the served versions; model control changes them in place
        self._work: dict[tuple[ipc.Channel, int], RowsRequest] = {}  # encoder requests in flight
        self._streams: dict[int, tuple[Stream, GenSequence]] = {}  # generation: core sequence id ->
        self._by_request: dict[tuple[ipc.Channel, int], GenSequence] = {}
        self._generation = 0  # of the model set; each change is the next one
        self._placements = self._models_message()
        self._applied: dict[ipc.Channel, int] = {}  # each frontend (said hello): the set it routes by
        self._acks = asyncio.Event()  # a frontend applied a set, or went away
        self._ack_timeout_s = ack_timeout_s
        self._controls: set[asyncio.Task[None]] = set()
        self._bind_generation()
        control.publish = self.publish

    def _models_message(self) -> ipc.Frames:
        c = self.control
        return ipc.pack(ipc.Models(c.placements(), os.getpid(), self._generation, c.index()))

    def _bind_generation(self) -> None:
        for model in self.models.values():
            if model.generation is not None:
                model.generation.bind(self._deliver, self._fail_streams)

    async def publish(self, wait: bool) -> None:
        """The model set (or only the index) changed: every frontend is told; with `wait`, this returns
        once each has applied it (or went away, or let `ack_timeout_s` pass: a hung one is replaced by
        the supervisor), so that no request is still on its way to a version about to drain."""
        self._bind_generation()
        self._generation += 1
        generation, self._placements = self._generation, self._models_message()
        for peer in list(self._applied):
            self._send(peer, self._placements)
        if not wait:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._ack_timeout_s
        while (late := [p for p, g in self._applied.items() if g < generation]) and loop.time() < deadline:
            self._acks.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acks.wait(), deadline - loop.time())
        if late:
            log.warning("engine core: %d frontend(s) missed model set %d", len(late), generation)

    def channel(self) -> ipc.Channel:
        """The protocol of one frontend's connection."""
        return ipc.Channel(self._receive, self._drop_peer)

    def _receive(self, peer: ipc.Channel, frames: list[bytes]) -> None:
        try:
            message = ipc.unpack_to_core(frames)
        except Exception as e:  # a frontend of another version, or garbage: say so, keep serving
            log.error("engine core: unreadable message from a frontend: %s", e)
            return
        self._dispatch(peer, message, frames)

    def _dispatch(self, peer: ipc.Channel, message: ipc.ToCore, frames: list[bytes]) -> None:
        if isinstance(message, ipc.Encode):
            self._encode(peer, message, frames)
        elif isinstance(message, ipc.Generate):
            self._generate(peer, message)
        elif isinstance(message, ipc.Abort):
            self._abort(peer, message.id)
        elif isinstance(message, ipc.Hello):
            self._applied[peer] = self._generation  # it routes by what it is sent now
            self._send(peer, self._placements)
        elif isinstance(message, ipc.ModelsApplied):
            if peer in self._applied:
                self._applied[peer] = max(self._applied[peer], message.generation)
                self._acks.set()
        elif isinstance(message, ipc.Control):
            task = asyncio.get_running_loop().create_task(self._control(peer, message))
            self._controls.add(task)
            task.add_done_callback(self._controls.discard)
        elif isinstance(message, ipc.StatsQuery):
            stats = ipc.EngineStats(message.id, [m.executions() for m in self.models.values()])
            self._send(peer, ipc.pack(stats))

    def _model(self, name: str, version: int) -> EngineModel:
        return self.control.get(name, version)  # raises: unknown, or retired since it was chosen

    async def _control(self, peer: ipc.Channel, message: ipc.Control) -> None:
        """Explicit load or unload; answered once every frontend applied the change."""
        try:
            if message.action == "load":
                await self.control.load(message.model)
            elif message.action == "unload":
                await self.control.unload(message.model)
            else:
                raise ValueError(f"unknown model control action {message.action!r}")
        except Exception as e:
            self._send(peer, ipc.pack(failure(message.id, e)))
            return
        self._send(peer, ipc.pack(ipc.Controlled(message.id)))

    # -- encoder requests -------------------------------------------------------------------------------

    def _encode(self, peer: ipc.Channel, message: ipc.Encode, frames: list[bytes]) -> None:
        try:
            batcher = self._model(message.model, message.version).batcher
            if batcher is None:
                raise ValueError(f"model {message.model!r} is not an encoder")
            rows = ipc.request_rows(message, frames)
            if len(rows) > 1:
                batcher.check_room(len(rows), message.priority)  # all or none: before anything queues
            request = RowsRequest(self, peer, message, batcher, len(rows))
            request.queue(rows)
        except Exception as e:
            self._send(peer, ipc.pack(failure(message.id, e)))
            return
        self._work[(peer, message.id)] = request

    def _answered(self, peer: ipc.Channel, request_id: int, frames: ipc.Frames) -> None:
        self._work.pop((peer, request_id), None)
        self._send(peer, frames)

    # -- generation ---------------------------------------------------------------------------------------

    def _generate(self, peer: ipc.Channel, message: ipc.Generate) -> None:
        try:
            generation = self._model(message.model, message.version).generation
            if generation is None:
                raise ValueError(f"model {message.model!r} does not generate")
            seq = GenSequence(prompt=message.prompt, params=message.params)
            generation.add(seq)
        except Exception as e:
            self._send(peer, ipc.pack(failure(message.id, e)))
            return
        self._streams[seq.id] = (Stream(peer, message.id), seq)
        self._by_request[(peer, message.id)] = seq

    def _deliver(self, produced: list[Produced]) -> None:
        """One step's tokens, one message per frontend."""
        by_peer: dict[ipc.Channel, list[ipc.TokenItem]] = {}
        for seq, token, index, finish, logprob, prompt in produced:
            entry = self._streams.get(seq.id)
            if entry is None:
                continue
            stream = entry[0]
            by_peer.setdefault(stream.peer, []).append(
                (
                    stream.request_id,
                    token,
                    index,
                    finish or "",
                    logprob,
                    prompt,
                    seq.cached_tokens * (index == 0),
                )
            )
            if finish is not None:
                self._forget(seq)
        for peer, items in by_peer.items():
            self._send(peer, ipc.pack(ipc.Tokens(items)))

    def _fail_streams(self, seqs: list[GenSequence], error: Exception) -> None:
        for seq in seqs:
            entry = self._streams.get(seq.id)
            if entry is not None:
                self._send(entry[0].peer, ipc.pack(failure(entry[0].request_id, error)))
                self._forget(seq)

    def _forget(self, seq: GenSequence) -> None:
        entry = self._streams.pop(seq.id, None)
        if entry is not None:
            self._by_request.pop((entry[0].peer, entry[0].request_id), None)

    # -- either -------------------------------------------------------------------------------------------

    def _abort(self, peer: ipc.Channel, request_id: int) -> None:
        request = self._work.pop((peer, request_id), None)
        if request is not None:
            request.abort()  # its queued rows leave the batcher before compute
        seq = self._by_request.get((peer, request_id))
        if seq is not None:
            seq.aborted = True
            self._forget(seq)
            self._wake_generation()

    def _drop_peer(self, peer: ipc.Channel) -> None:
        """A frontend's connection ended (it died, or stopped): its work is nobody's."""
        for key in [k for k in self._work if k[0] == peer]:
            self._work.pop(key).abort()
        for key in [k for k in self._by_request if k[0] == peer]:
            seq = self._by_request[key]
            seq.aborted = True
            self._forget(seq)
        self._wake_generation()
        if self._applied.pop(peer, None) is not None:
            self._acks.set()  # nobody waits for its word any more

    def _wake_generation(self) -> None:
        for model in self.models.values():
            if model.generation is not None:
                model.generation.wake()

    def _send(self, peer: ipc.Channel, frames: ipc.Frames) -> None:
        if not peer.send(frames):  # the frontend is gone; its connection_lost drops its work
            log.debug("engine core: an answer to a frontend that is gone was dropped")

    async def close(self) -> None:
        """Finish what is queued and running (frontends drain first), then stop every model."""
        await self.control.close()


async def run_core(
    settings: Settings,
    engine_factory: EngineFactory,
    on_ready: Callable[[], None] | None = None,
    on_tick: Callable[[], None] | None = None,
) -> None:
    """Load, warm up, bind, serve until SIGTERM/SIGINT; then finish queued work and stop."""
    metrics = Metrics(tracing=setup_tracing("engine-core"))  # on: a span per traced engine batch
    control = ModelControl(settings, metrics, engine_factory)
    await control.start(StartupClock("engine-core"))
    core = EngineCore(control, ack_timeout_s=settings.worker_timeout_s)
    path = ipc.socket_path(settings.engine_address)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a crashed core's socket: the supervisor restarts it on the same address
    server = await asyncio.get_running_loop().create_unix_server(core.channel, path)
    log.info("engine core (pid %d) ready on %s", os.getpid(), settings.engine_address)
    if on_ready is not None:
        on_ready()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ticking = loop.create_task(_tick(functools.partial(_each_second, metrics, on_tick)))
    await stop.wait()
    log.info("engine core: stopping; finishing queued work")
    # Keep answering while the queues drain: what is queued still goes back to its frontends.
    await core.close()
    ticking.cancel()
    server.close()
    await server.wait_closed()
    if metrics.tracing is not None:
        metrics.tracing.shutdown()  # the last batches' spans leave


def _each_second(metrics: Metrics, on_tick: Callable[[], None] | None) -> None:
    """The supervisor's heartbeat (`on_tick`), and the core's resident memory for /metrics."""
    if on_tick is not None:
        on_tick()
    resident = resident_bytes()
    if resident is not None:
        metrics.engine_core_memory.set(resident)


async def _tick(on_tick: Callable[[], None]) -> None:
    while True:
        on_tick()
        await asyncio.sleep(1.0)
