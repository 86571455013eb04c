"""A frontend's connection to the engine core over service.ipc (its models' handles: remote_models).

One Unix-socket connection per frontend; each answer goes straight to the request waiting for it. The
frontend keeps its own tokenizers and manifests (read from the repository); the core tells it where each
model runs. When the core goes away (a crash, a restart: the kernel closes the connection at once), every
request waiting on it is answered 503 with `Retry-After` at once, and new ones are refused the same way
until the core is back: nothing waits on a dead core. A request whose client leaves sends `Abort`, so its
queued work leaves the core's batch queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Histogram

from service import ipc
from service.batch_policy import (
    BatcherClosedError,
    DeadlineExceededError,
    QueueFullError,
    QueueTooSmallError,
)
from service.engine import EngineError
from service.generation.engine_thread import Produced
from service.generation.sequence import FinishReason
from service.generation.sequence import Sequence as GenSequence
from service.manifest import Manifest
from service.metrics import Metrics
from service.model_control import ModelControlError, ModelRetiredError
from service.registry import ModelNotFoundError
from service.remote_models import RemoteEncoder, RemoteGenerator
from service.repository import read_version
from service.served import ServedModel, same_interface, text_encoder
from service.settings import Settings
from service.tasks.contract import InvalidInputError

EngineUnavailableError = ipc.EngineUnavailableError

log = logging.getLogger(__name__)

RECONNECT_MIN_S, RECONNECT_MAX_S = 0.05, 1.0  # while the core is away: try again, less and less often


def error_from(failed: ipc.Failed) -> Exception:
    """The core's failure as the exception the HTTP layer maps to a status (service.core.failure)."""
    kind, message = failed.kind, failed.message
    if kind == "queue_full":
        return QueueFullError(failed.retry_after_s)
    if kind == "deadline":
        return DeadlineExceededError(message)
    if kind == "closed":
        return BatcherClosedError(message)
    if kind == "too_large":
        return QueueTooSmallError(message)
    if kind == "invalid":
        return InvalidInputError(message)
    if kind == "not_found":
        return ModelNotFoundError(message)
    if kind == "retired":
        return ModelRetiredError(message)
    if kind == "control":
        return ModelControlError(message)
    return EngineError(message)


@dataclass(frozen=True)
class Waiting:
    """An encoder request sent to the core, waiting for its answer."""

    future: asyncio.Future[tuple[ipc.Encoded, list[bytes]]]
    sent_at: float
    hop: Histogram  # distilserve_ipc_duration_seconds of its model


class RemoteEngine:
    """The engine core as this frontend sees it (an `EngineConnection` for service.app)."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._path = ipc.socket_path(settings.engine_address)
        self._channel: ipc.Channel | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, Waiting] = {}
        self._queries: dict[int, asyncio.Future[ipc.EngineStats]] = {}
        self._controls: dict[int, asyncio.Future[None]] = {}
        self._streams: dict[int, tuple[RemoteGenerator, GenSequence]] = {}
        self._models: asyncio.Future[ipc.Models] | None = None
        self._views: dict[tuple[str, int], ServedModel] = {}  # what this frontend routes to now
        self._index: list[ipc.IndexRow] = []
        self._on_change: Callable[[list[ServedModel]], None] | None = None
        self._applying = asyncio.Lock()  # model sets are applied one at a time, in order
        self._appliers: set[asyncio.Task[None]] = set()
        self._core_pid: int | None = None
        self._up = False
        self._connector: asyncio.Task[None] | None = None

    @property
    def available(self) -> bool:
        return self._up

    async def open(self) -> list[ServedModel]:
        """Wait for the core (it listens once its models are warm), then build a view of each model."""
        loop = asyncio.get_running_loop()
        self._models = loop.create_future()
        self._connector = loop.create_task(self._keep_connected(), name="engine-core-connection")
        try:
            async with self._applying:  # a change that comes meanwhile is applied after, to these views
                message = await asyncio.shield(self._models)
                self._views = await asyncio.to_thread(self._served, message.models, {})
                self._index = message.index
                return list(self._views.values())
        except BaseException:
            self._connector.cancel()
            raise

    def watch(self, on_change: Callable[[list[ServedModel]], None]) -> None:
        """`on_change(models)` runs when the core serves another set of versions (service.model_control),
        before the core is told this frontend routes by it."""
        self._on_change = on_change

    def index(self) -> list[ipc.IndexRow]:
        return self._index

    def successor(self, manifest: Manifest) -> ServedModel | None:
        """The highest served version of the same model that a request made for `manifest` can run on."""
        newer = [
            v
            for (name, version), v in self._views.items()
            if name == manifest.name and version > manifest.version and same_interface(manifest, v.manifest)
        ]
        return max(newer, key=lambda v: v.manifest.version, default=None)

    async def control(self, action: str, model: str) -> None:
        """Ask the core to load or unload `model`; returns once every frontend serves the result."""
        request_id = self.next_id()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._controls[request_id] = future
        try:
            self.send(ipc.pack(ipc.Control(request_id, action, model)))
            await future
        finally:
            self._controls.pop(request_id, None)

    async def _keep_connected(self) -> None:
        """Connect, say hello, and when the connection ends answer everyone waiting and connect again."""
        loop = asyncio.get_running_loop()
        delay = RECONNECT_MIN_S
        while True:
            lost: asyncio.Future[None] = loop.create_future()

            def on_lost(_: ipc.Channel, lost: asyncio.Future[None] = lost) -> None:
                if not lost.done():
                    lost.set_result(None)

            try:
                _, channel = await loop.create_unix_connection(
                    lambda: ipc.Channel(self._receive, on_lost), self._path
                )
            except OSError:  # not listening yet (loading, restarting)
                await asyncio.sleep(delay)
                delay = min(RECONNECT_MAX_S, 2 * delay)
                continue
            delay = RECONNECT_MIN_S
            self._channel = channel
            channel.send(ipc.pack(ipc.Hello()))  # it answers with its models; only then is it up
            await lost
            self._channel = None
            if self._up:
                log.error("the engine core went away; answering 503 until it is back")
            self._up = False
            self._fail_all(EngineUnavailableError("the engine core went away; retry shortly"))

    def _served(
        self, placements: list[ipc.Placement], known: dict[tuple[str, int], ServedModel]
    ) -> dict[tuple[str, int], ServedModel]:
        """A view of each placement: the known ones as they are, new ones read from the repository (the
        core validated every file's checksum; this reads the manifest and the tokenizer)."""
        served: dict[tuple[str, int], ServedModel] = {}
        for placement in placements:
            key = (placement.name, placement.version)
            if key in known:
                served[key] = known[key]
                continue
            directory = self.settings.model_repository / placement.name / str(placement.version)
            try:
                version = read_version(directory, verify_checksums=False)
            except Exception as e:  # the core loaded what this frontend cannot read: serve the rest
                log.error("%s v%d runs in the engine core but cannot be read here: %s", *key, e)
                continue
            view = ServedModel(version, text_encoder(version), placement)
            if version.manifest.generation is not None:
                view.generator = RemoteGenerator(self, view)
            else:
                view.encoding = RemoteEncoder(self, version.manifest)
            served[key] = view
        return served

    async def _apply(self, message: ipc.Models) -> None:
        """A model set after the first: new versions' views built off the loop, the routing swapped, then
        the core told (it waits for that before a dropped version drains)."""
        async with self._applying:
            try:
                views = await asyncio.to_thread(self._served, message.models, self._views)
                if views.keys() != self._views.keys():
                    self._views = views
                    if self._on_change is not None:
                        self._on_change(list(views.values()))
                    log.info("serving %s", ", ".join(f"{n} v{v}" for n, v in sorted(views)))
                self._index = message.index
            finally:
                with contextlib.suppress(EngineUnavailableError):
                    self.send(ipc.pack(ipc.ModelsApplied(message.generation)))

    async def executions(self) -> list[ipc.Executions]:
        request_id = self.next_id()
        future: asyncio.Future[ipc.EngineStats] = asyncio.get_running_loop().create_future()
        self._queries[request_id] = future
        try:
            self.send(ipc.pack(ipc.StatsQuery(request_id)))
            return (await asyncio.wait_for(future, self.settings.worker_timeout_s)).models
        except TimeoutError:
            raise EngineUnavailableError("the engine core did not answer; retry shortly") from None
        finally:
            self._queries.pop(request_id, None)

    async def close(self) -> None:
        if self._connector is not None:
            self._connector.cancel()
        self._up = False
        self._fail_all(BatcherClosedError("the server is shutting down"))
        if self._channel is not None:
            self._channel.close()

    # -- sending ------------------------------------------------------------------------------------------

    def send(self, frames: ipc.Frames) -> None:
        """Hand a message to the core, or refuse at once (503) when there is none to take it."""
        if not self._up or self._channel is None or not self._channel.send(frames):
            raise EngineUnavailableError("the engine core is restarting; retry shortly")

    def next_id(self) -> int:
        return next(self._ids)

    def expect(self, request_id: int, hop: Histogram) -> asyncio.Future[tuple[ipc.Encoded, list[bytes]]]:
        """A future for the answer to `request_id`; the hop's own time goes to `hop` when it comes."""
        future: asyncio.Future[tuple[ipc.Encoded, list[bytes]]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = Waiting(future, time.perf_counter(), hop)
        return future

    def forget(self, request_id: int) -> None:
        self._pending.pop(request_id, None)

    def abort(self, request_id: int) -> None:
        with contextlib.suppress(EngineUnavailableError):
            self.send(ipc.pack(ipc.Abort(request_id)))

    def add_stream(self, generator: RemoteGenerator, seq: GenSequence) -> None:
        self._streams[seq.id] = (generator, seq)

    def drop_stream(self, seq: GenSequence) -> bool:
        return self._streams.pop(seq.id, None) is not None

    # -- receiving ----------------------------------------------------------------------------------------

    def _receive(self, _: ipc.Channel, frames: list[bytes]) -> None:
        try:
            message = ipc.unpack_to_frontend(frames)
        except Exception as e:
            log.error("unreadable message from the engine core: %s", e)
            return
        try:
            self._dispatch(message, frames)
        except Exception:  # a bug in handing out one answer must not stop the others
            log.exception("handing out an engine core answer failed")

    def _dispatch(self, message: ipc.ToFrontend, frames: list[bytes]) -> None:
        if isinstance(message, ipc.Encoded):
            waiting = self._pending.pop(message.id, None)
            if waiting is not None and not waiting.future.done():
                waiting.hop.observe(max(0.0, time.perf_counter() - waiting.sent_at - message.core_s))
                waiting.future.set_result((message, frames))
        elif isinstance(message, ipc.Tokens):
            self._tokens(message)
        elif isinstance(message, ipc.Failed):
            error = error_from(message)
            waiting = self._pending.pop(message.id, None)
            if waiting is not None and not waiting.future.done():
                waiting.future.set_exception(error)
            control = self._controls.pop(message.id, None)
            if control is not None and not control.done():
                control.set_exception(error)
            entry = self._streams.pop(message.id, None)
            if entry is not None:
                entry[0].fail([entry[1]], error)
        elif isinstance(message, ipc.EngineStats):
            query = self._queries.pop(message.id, None)
            if query is not None and not query.done():
                query.set_result(message)
        elif isinstance(message, ipc.Controlled):
            control = self._controls.pop(message.id, None)
            if control is not None and not control.done():
                control.set_result(None)
        elif isinstance(message, ipc.Models):
            if self._core_pid is not None and self._core_pid != message.pid:
                log.warning("the engine core was restarted (pid %d, was %d)", message.pid, self._core_pid)
            self._core_pid = message.pid
            self._up = True
            if self._models is not None and not self._models.done():
                self._models.set_result(message)
            elif self._models is not None:  # a change, or a restarted core's set: applied in order
                task = asyncio.get_running_loop().create_task(self._apply(message))
                self._appliers.add(task)
                task.add_done_callback(self._appliers.discard)

    def _tokens(self, message: ipc.Tokens) -> None:
        by_generator: dict[int, tuple[RemoteGenerator, list[Produced]]] = {}
        for request_id, token, index, finish, logprob, prompt, cached in message.items:
            entry = self._streams.get(request_id)
            if entry is None:
                continue
            generator, seq = entry
            seq.output.append(token)
            if index == 0:
                seq.cached_tokens = cached
            reason: FinishReason | None = finish or None  # type: ignore[assignment]
            if reason is not None:
                self._streams.pop(request_id, None)
            by_generator.setdefault(id(generator), (generator, []))[1].append(
                (seq, token, index, reason, logprob, prompt)
            )
        for generator, produced in by_generator.values():
            generator.deliver(produced)

    def _fail_all(self, error: Exception) -> None:
        pending, self._pending = self._pending, {}
        queries, self._queries = self._queries, {}
        controls, self._controls = self._controls, {}
        futures: list[asyncio.Future[Any]] = [
            *(w.future for w in pending.values()),
            *queries.values(),
            *controls.values(),
        ]
        for future in futures:
            if not future.done():
                future.set_exception(error)
        streams, self._streams = self._streams, {}
        for generator, seq in streams.values():
            generator.fail([seq], error)
