"""Which model versions the engine serves, and changing them while it serves (DISTILSERVE_MODEL_CONTROL).

- `none`: every valid version in the repository at start-up, until the next start.
- `poll` and `explicit`: each model serves its highest valid version. `sync` re-reads models' directories
  (every `repository_poll_s`, or when a load is asked for): a version above the served one is validated
  (manifest, every file's checksum), loaded and warmed off the event loop, and only then published; the
  version it supersedes, or one whose directory is gone (a rollback: the version below it is loaded again),
  or every version of a model unloaded on request, is published as gone, drains (its queued and running work
  finishes), then is unloaded. A version that fails validation, loading or warm-up never takes traffic: the
  index shows it UNAVAILABLE with the reason while the one before it keeps serving. A failure is tried again
  only once the version's files change.

Publishing is the holder's (`publish`): the engine core sends the new set to every frontend and returns once
each has applied it (service.core), so nothing is still on its way to a version when it starts draining; in
one process the registry is swapped at once (service.app). A request that still reaches a retired version
(one that chose its model before the swap and sent after it) gets `ModelRetiredError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from service.batching import ClientWork
from service.drafts import attach_drafts, follow_student
from service.engine_plan import EngineFactory
from service.generation.tuning import thread_spinning
from service.ipc import EngineUnavailableError, IndexRow, Placement
from service.manifest import Manifest
from service.memory import give_back_freed_memory
from service.metrics import Metrics
from service.registry import ModelNotFoundError
from service.repository import RepositoryError, read_manifest, read_version
from service.runtime import (
    EngineModel,
    StartupError,
    load_engine_model,
)
from service.settings import Settings
from service.startup import StartupClock
from service.tasks import TASKS

log = logging.getLogger(__name__)

Key = tuple[str, int]
Stamp = tuple[tuple[str, int, int], ...]


class ModelControlError(ValueError):
    """A load or unload that cannot be done (HTTP 400, gRPC INVALID_ARGUMENT), with the reason."""


class ModelRetiredError(EngineUnavailableError):
    """The version was unloaded after the request chose it (HTTP 503: a retry goes to its successor)."""

    retry_after_s = 0.0


async def _published(wait: bool) -> None:
    """No holder to tell (before one is attached)."""


def _stamp(directory: Path) -> Stamp:
    """What a version directory holds, by name, size and mtime: a failed version is tried again once it
    changes (a copy that was still being written, a file put right)."""
    try:
        return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()))
    except OSError:
        return ()


def _versions_on_disk(model_dir: Path) -> list[int]:
    """The integer version directories of one model, highest first (hidden ones are exports in progress)."""
    if not model_dir.is_dir():
        return []
    found = (p.name for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    return sorted((int(v) for v in found), reverse=True)


class ModelControl:
    """The served versions (`models`, the dict the engine looks requests up in) and the repository index."""

    def __init__(self, settings: Settings, metrics: Metrics, engine_factory: EngineFactory) -> None:
        self.settings, self.metrics, self.engine_factory = settings, metrics, engine_factory
        self.root = settings.model_repository
        self.models: dict[Key, EngineModel] = {}
        self.retired: set[Key] = set()  # unloaded while serving: a late request is told so, not 404
        # the holder's: tell whoever routes requests; `wait`: return once every one of them applied it
        self.publish: Callable[[bool], Awaitable[None]] = _published
        self._retiring: set[Key] = set()  # published as gone, still answering what was already on its way
        self._started = False
        self._index: dict[Key, IndexRow] = {}
        self._failed: dict[Key, tuple[Stamp, str]] = {}
        self._clients = ClientWork()  # the models share the cores: shadow work yields to all their clients
        self._lock = asyncio.Lock()
        self._polling: asyncio.Task[None] | None = None

    # -- what is served ---------------------------------------------------------------------------------

    def placements(self) -> list[Placement]:
        return [self.models[k].placement() for k in sorted(self.models) if k not in self._retiring]

    def index(self) -> list[IndexRow]:
        """Every version the repository holds (or held while served), by name and version."""
        return [self._index[k] for k in sorted(self._index)]

    def get(self, name: str, version: int) -> EngineModel:
        model = self.models.get((name, version))
        if model is not None:
            return model
        if (name, version) in self.retired:
            raise ModelRetiredError(f"model {name!r} version {version} was unloaded; retry")
        raise LookupError(f"model {name!r} version {version} is not loaded in the engine")

    # -- start-up -----------------------------------------------------------------------------------------

    async def start(self, clock: StartupClock) -> list[EngineModel]:
        """The repository's versions loaded, warmed and started (all of them under `none`, each model's
        highest valid one otherwise); polling started under `poll`.

        Raises StartupError when nothing can be served, or when anything is broken and the repository must
        be whole (`DISTILSERVE_STRICT_REPOSITORY`)."""
        if not self.root.is_dir():
            raise StartupError(f"{self.root}: model repository directory does not exist")
        if self.settings.thread_spinning == "auto":
            spinning = thread_spinning(self._manifests_on_disk())
            log.info("ONNX Runtime's threads: %s (DISTILSERVE_THREAD_SPINNING=auto)", spinning)
            self.settings = self.settings.model_copy(update={"thread_spinning": spinning})
        async with self._lock:
            for name in self._names_on_disk():
                if self.settings.model_control == "none":
                    for version in _versions_on_disk(self.root / name):
                        await self._load(name, version, clock)
                else:
                    await self._choose(name, clock)
            problems = [f"{r.reason}" for r in self.index() if r.state == "UNAVAILABLE"]
            if problems and self.settings.strict_repository:
                raise StartupError("; ".join(problems))
            if not self.models:
                found = "; ".join(problems) or "no <name>/<version>/manifest.json found"
                raise StartupError(f"no servable model in {self.root}: {found}")
            with clock.phase("drafts"):
                attach_drafts(list(self.models.values()), self.settings)
            with clock.phase("memory"):  # what loading freed (parsing, a dropped timing session) goes back
                give_back_freed_memory("models loaded")
            self._started = True
        clock.report(self.metrics.startup_seconds)
        if self.settings.model_control == "poll":
            self._polling = asyncio.get_running_loop().create_task(self._poll(), name="repository-poll")
        return list(self.models.values())

    def _names_on_disk(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def _manifests_on_disk(self) -> list[Manifest]:
        """Each model's highest version's manifest that reads (the others are reported when loaded)."""
        found = []
        for name in self._names_on_disk():
            versions = _versions_on_disk(self.root / name)
            with contextlib.suppress(RepositoryError):
                if versions:
                    found.append(read_manifest(self.root / name / str(max(versions))))
        return found

    # -- changes ------------------------------------------------------------------------------------------

    async def load(self, name: str) -> None:
        """Explicit control: serve `name`'s highest valid version (loading it when it is new)."""
        self._refuse_unless_explicit("load", name)
        if name not in self._names_on_disk():  # a plain directory of the root: never "", "..", a path
            raise ModelNotFoundError(f"no model {name!r} in the repository {self.root}")
        await self.sync([name])
        if not any(k[0] == name for k in self.models):
            reasons = [r.reason for r in self.index() if r.name == name and r.reason]
            raise ModelControlError(f"failed to load {name!r}: " + ("; ".join(reasons) or "no version found"))

    async def unload(self, name: str) -> None:
        """Explicit control: every version of `name` drains and is unloaded."""
        self._refuse_unless_explicit("unload", name)
        async with self._lock:
            served = [k for k in self.models if k[0] == name]
            if not served:
                raise ModelNotFoundError(f"model {name!r} is not loaded")
            await self._retire(served, "unloaded")
            await asyncio.to_thread(give_back_freed_memory, f"{name} unloaded")

    def _refuse_unless_explicit(self, action: str, name: str) -> None:
        mode = self.settings.model_control
        if mode == "explicit":
            return
        why = (
            "the repository is polled (DISTILSERVE_MODEL_CONTROL=poll): add or remove version directories"
            if mode == "poll"
            else "the model repository is fixed at start-up (DISTILSERVE_MODEL_CONTROL=none); restart the "
            "server, or run it with DISTILSERVE_MODEL_CONTROL=explicit"
        )
        raise ModelControlError(f"cannot {action} {name!r}: {why}")

    async def sync(self, names: list[str] | None = None) -> None:
        """Re-read these models' directories (every model's when None) and serve what they now hold."""
        async with self._lock:
            on_disk = set(self._names_on_disk()) if self.root.is_dir() else set()
            served = {k[0] for k in self.models}
            changed = False
            for name in sorted(set(names) if names is not None else on_disk | served):
                before = [k for k in self.models if k[0] == name]
                chosen = await self._choose(name, StartupClock("reload"))
                if chosen is not None and chosen not in before:
                    await self.publish(True)  # the new version takes the traffic everywhere ...
                superseded = [k for k in before if k != chosen]
                if superseded:  # ... before the one it replaces stops taking any
                    why = f"superseded by version {chosen[1]}" if chosen else "removed from the repository"
                    await self._retire(superseded, why)
                changed = changed or [k for k in self.models if k[0] == name] != before
            self._forget_vanished()
            if changed:  # what a load freed, and the sessions a retired version dropped, go back
                await asyncio.to_thread(give_back_freed_memory, "models changed")

    async def _choose(self, name: str, clock: StartupClock) -> Key | None:
        """The highest version of `name` that is served or loads now; None when none does. The versions
        below it are listed as superseded."""
        on_disk = _versions_on_disk(self.root / name)
        chosen: Key | None = None
        for version in on_disk:
            key = (name, version)
            if key in self.models:
                chosen = key
                break
            failed = self._failed.get(key)
            if failed is not None and failed[0] == _stamp(self.root / name / str(version)):
                continue  # broken and unchanged: the version below it is the candidate
            if await self._load(name, version, clock):
                chosen = key
                break
        if chosen is not None:
            for version in (v for v in on_disk if v < chosen[1] and (name, v) not in self.models):
                if (name, version) not in self._failed:
                    why = f"superseded by version {chosen[1]}"
                    self._index[(name, version)] = IndexRow(name, version, "UNAVAILABLE", why)
        return chosen

    async def _load(self, name: str, version: int, clock: StartupClock) -> bool:
        """Validate, load, warm and start one version; on failure it is UNAVAILABLE with the reason."""
        key, directory = (name, version), self.root / name / str(version)
        self._index[key] = IndexRow(name, version, "LOADING")
        await self.publish_index()
        try:
            model = await asyncio.to_thread(self._build, directory, clock)
        except Exception as e:
            reason = str(e) if isinstance(e, RepositoryError) else f"{directory}: {e}"
            log.error("model %s version %d is not served: %s", name, version, reason)
            self._failed[key] = (_stamp(directory), reason)
            self.metrics.model_loads.labels(name, "failed").inc()
            self._index[key] = IndexRow(name, version, "UNAVAILABLE", reason)
            await self.publish_index()
            return False
        if self._started:  # a teacher loaded while serving drafts with its served student, and a served
            serving = [
                *self.models.values(),
                model,
            ]  # teacher with its student's new version (timed: a thread)
            await asyncio.to_thread(attach_drafts, serving, self.settings, model)
            await asyncio.to_thread(follow_student, serving, model, self.settings)
        model.start()
        self.models[key] = model
        self.retired.discard(key)
        self._failed.pop(key, None)
        self._index[key] = IndexRow(name, version, "READY")
        self.metrics.model_loads.labels(name, "ready").inc()
        return True

    def _build(self, directory: Path, clock: StartupClock) -> EngineModel:
        """On a worker thread: what a version needs before it may take traffic."""
        with clock.phase("repository"):  # manifest read and validated, every file's checksum
            version = read_version(directory)
        with clock.phase("sessions"):  # ONNX Runtime sessions (and a decoder's thread timing)
            asks = TASKS[version.manifest.task].engine
            model = load_engine_model(
                version, self.settings, self.metrics, self.engine_factory, self._clients, asks
            )
        if self.settings.warmup:
            try:
                with clock.phase("warm-up"):
                    model.warm_up()
            except Exception as e:
                self._discard(model)
                raise RuntimeError(f"warm-up failed: {e}") from e
        return model

    async def _retire(self, keys: list[Key], why: str) -> None:
        """Out of the served set (published first), drained, unloaded."""
        for key in keys:
            self._index[key] = IndexRow(*key, "UNLOADING", why)
        self._retiring.update(keys)
        await self.publish(True)  # every router has stopped sending to them: what was sent is here
        retiring = [self.models.pop(k) for k in keys]
        self._retiring.difference_update(keys)
        self.retired.update(keys)
        for key, model in zip(keys, retiring, strict=True):
            if self._started:  # a teacher drafting with it goes on alone
                follow_student(list(self.models.values()), model, self.settings, gone=True)
            await model.close()  # its queued and running work finishes
            self._discard(model)
            self._index[key] = IndexRow(*key, "UNAVAILABLE", why)
            log.info("model %s version %d unloaded: %s", key[0], key[1], why)
        await self.publish_index()

    def _discard(self, model: EngineModel) -> None:
        if model.batcher is not None and model.batcher in self._clients.batchers:
            self._clients.batchers.remove(model.batcher)
        model.executor.shutdown(wait=False)
        m, provider = model.manifest, model.engine.provider
        # 0, not removed: prometheus_client cannot remove a series in multiprocess mode
        self.metrics.model_info.labels(m.name, str(m.version), m.task, model.variant, provider).set(0)

    def _forget_vanished(self) -> None:
        """Index rows of versions neither served nor on disk any more."""
        for key in [k for k in self._index if k not in self.models]:
            if not (self.root / key[0] / str(key[1])).is_dir():
                del self._index[key]
                self._failed.pop(key, None)

    async def publish_index(self) -> None:
        """The index changed but not what is served: holders that show it refresh (no wait needed)."""
        await self.publish(False)

    # -- polling ------------------------------------------------------------------------------------------

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.settings.repository_poll_s)
            try:
                await self.sync()
            except Exception:  # one bad read must not end polling
                log.exception("reading the model repository failed; trying again next poll")

    async def close(self) -> None:
        """Stop polling; finish queued and running work of every model, then stop them."""
        if self._polling is not None:
            self._polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._polling
        await asyncio.gather(*(m.close() for m in self.models.values()))
