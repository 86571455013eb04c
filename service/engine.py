"""One ONNX Runtime session per served model variant, and the small interface the batcher calls.

The provider actually running is read back from the session (`get_providers()`), never assumed:
ONNX Runtime lists CUDA as available even without a GPU and silently falls back to CPU.

On a GPU the engine binds its inputs and outputs (ONNX Runtime's IO binding): host arrays are copied to the
device once by ONNX Runtime, outputs come back to the host once, and what a caller keeps on the device (the
generation KV cache) stays there as OrtValues between calls. IO binding works with the CPU provider too, so
tests force it on (`io_binding="on"`) to exercise the GPU's code path on a CPU.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Literal, Protocol, TypeAlias, runtime_checkable

import numpy as np
import onnxruntime as ort

from service import graph_cache

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


class EngineError(RuntimeError):
    """The engine failed on a batch; only that batch's requests fail."""


class GpuUnavailableError(RuntimeError):
    """A GPU was required (`DISTILSERVE_REQUIRE_GPU=1`) but ONNX Runtime could not use one."""


class Engine(Protocol):
    """What the service needs from a backend: run named arrays, say where it runs."""

    @property
    def provider(self) -> str: ...

    @property
    def input_names(self) -> list[str]: ...

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


Feed: TypeAlias = "np.ndarray | ort.OrtValue"  # a host array, or a value already on the engine's device


@runtime_checkable
class DeviceEngine(Engine, Protocol):
    """An engine that can leave tensors on its device between calls (the generation KV cache)."""

    @property
    def binds_io(self) -> bool: ...

    def run_bound(self, feeds: dict[str, Feed], keep: Collection[str] = ()) -> dict[str, Feed]: ...

    def to_device(self, array: np.ndarray) -> ort.OrtValue: ...

    def companion(self, model: bytes) -> DeviceEngine: ...


IoBinding = Literal["auto", "on", "off"]
Spinning = Literal["run", "off"]


def cgroup_cpu_quota(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """Whole cores a cgroup v2 CPU quota allows (`docker --cpus`, a Kubernetes CPU limit), rounded up;
    None without a quota."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a CPU quota. `os.cpu_count()` counts the
    host's, so a container limited to 2 of 64 cores would run 64 threads (or engine instances)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cores, quota)) if quota else cores


def name_this_thread(name: str) -> None:
    """Name the calling thread for `top -H`, `ps` and /proc (Linux's 15-character comm; best effort):
    an operator, and the benchmark's CPU accounting, can then tell a frontend from the engine core, and an
    engine thread from its event loop. Threads started later inherit it."""
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def choose_providers(device: str) -> list[str]:
    """Providers to ask for, best first; CPU is always the last resort."""
    if device == "cpu":
        return [CPU]
    return [CUDA, CPU] if CUDA in ort.get_available_providers() else [CPU]


def preload_cuda_libraries() -> None:
    """Load CUDA and cuDNN from the `nvidia-*` pip packages where those are installed (onnxruntime-gpu's
    `[cuda,cudnn]` extra, or a PyTorch environment); with a CUDA base image the system copies are used."""
    try:
        ort.preload_dlls()
    except Exception as e:  # missing packages are fine: the system libraries are tried next
        log.debug("onnxruntime.preload_dlls: %s", e)


def _session_options(
    intra_op_threads: int,
    inter_op_threads: int,
    bounded_memory: bool,
    spinning: Spinning,
    *,
    optimize: bool,
) -> ort.SessionOptions:
    """`optimize=False` opens a graph ONNX Runtime optimised and wrote earlier (service/graph_cache.py)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.intra_op_num_threads = intra_op_threads or available_cores()
    options.inter_op_num_threads = inter_op_threads
    # "run": the pool's threads spin between a call's operators (a sleeping thread is woken for each of a
    # decoder's ~1,000 operators a step otherwise) and stop when the call returns, so that an idle session
    # never spins against a busy one (a teacher and its draft, a cascade's two models) or the frontends.
    # ONNX Runtime's own default, spinning between calls too, halved a drafted teacher's speed on 2 cores.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning == "run" else "0")
    if spinning == "run":
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.log_severity_level = 3
    if bounded_memory:
        # ONNX Runtime plans and keeps a memory pattern (one block sized for the run) for every new
        # set of input shapes, batch x padded length and every KV-cache length: under varied traffic
        # memory grows with the shapes met. Without them the arena holds what the largest batches need.
        # benchmarks/arena_bench.py (the four demo models, the core's threads, 2 x 3 min alternating,
        # shared 2-core CPU): RSS from 1 min to the end +18/+24 % vs +34/+34 % with the patterns, peak
        # 854/835 vs 1072/1115 MiB, sequences/s 0.97x/1.05x. `make soak` (10 min): the engine core's RSS
        # +1.0 % vs +3.5 % with the patterns (docs/benchmarks.md).
        options.enable_mem_pattern = False
    return options


class OrtEngine:
    """A session with explicit thread settings. ONNX Runtime's `run` is thread-safe: a model's instances
    (concurrent engine calls) share this one session and its weights."""

    def __init__(
        self,
        model_path: Path | bytes,
        *,
        device: str = "auto",
        require_gpu: bool = False,
        intra_op_threads: int = 0,
        inter_op_threads: int = 1,
        bounded_memory: bool = True,
        io_binding: IoBinding = "auto",
        cached_graph: Path | None = None,
        spinning: Spinning = "run",
    ) -> None:
        """`model_path`: a file, or a serialized model (a helper graph such as generation/row_graph.py's).
        `bounded_memory=False` keeps ONNX Runtime's memory defaults (only to measure what they cost).
        `io_binding`: auto binds on CUDA only (on a CPU plain `run` is as fast: see `binds_io`).
        `cached_graph`: where this file's optimised graph is kept between starts (service/graph_cache.py):
        opened from there when it exists, written there when not; CPU sessions only.
        `spinning`: whether the intra-op threads spin while a call runs ("run") or sleep between operators
        ("off"); see `_session_options`."""
        wanted = choose_providers(device)
        if CUDA in wanted:
            preload_cuda_libraries()
        source = model_path if isinstance(model_path, bytes) else str(model_path)
        if cached_graph is not None and wanted != [CPU]:
            cached_graph = None
        self.from_cached_graph = False
        if cached_graph is not None and cached_graph.exists():
            options = _session_options(
                intra_op_threads, inter_op_threads, bounded_memory, spinning, optimize=False
            )
            try:
                self._session = ort.InferenceSession(
                    str(cached_graph), sess_options=options, providers=wanted
                )
                self.from_cached_graph = True
                graph_cache.opened(cached_graph)
            except Exception:  # ORT raises its own types; the exported graph is still there
                graph_cache.forget(cached_graph)
        if not self.from_cached_graph:
            options = _session_options(
                intra_op_threads, inter_op_threads, bounded_memory, spinning, optimize=True
            )
            if cached_graph is not None and graph_cache.prepare(cached_graph):
                written = graph_cache.writing_path(cached_graph)
                options.optimized_model_filepath = str(written)
                try:
                    self._session = ort.InferenceSession(source, sess_options=options, providers=wanted)
                    graph_cache.keep(written, cached_graph)
                except Exception as e:  # e.g. a graph over 2 GB cannot be written as one file: open it plain
                    written.unlink(missing_ok=True)
                    log.warning("%s: optimised graph not cached (%s)", model_path, e)
                    cached_graph = None
            else:
                cached_graph = None
            if cached_graph is None:
                options.optimized_model_filepath = ""
                self._session = ort.InferenceSession(source, sess_options=options, providers=wanted)
        if isinstance(model_path, bytes):
            model_path = Path(f"<{len(model_path)} bytes>")
        self._provider = self._session.get_providers()[0]
        wants_gpu = device == "gpu" or require_gpu
        if wants_gpu and self._provider != CUDA:
            message = f"GPU requested for {model_path} but ONNX Runtime runs it on {self._provider}"
            if require_gpu:
                raise GpuUnavailableError(message)
            log.warning("%s: falling back to CPU", message)
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._outputs = [o.name for o in self._session.get_outputs()]
        on_cuda = self._provider == CUDA
        self._binds_io = io_binding == "on" or (io_binding == "auto" and on_cuda)
        self._device = ("cuda", 0) if on_cuda else ("cpu", 0)  # the session's device (type, id)
        self._bindings = threading.local()  # one IOBinding per engine thread, reused call after call
        log.info(
            "loaded %s on %s (asked for %s), io binding %s%s",
            model_path,
            self._provider,
            wanted,
            "on" if self._binds_io else "off",
            ", from its cached optimised graph" if self.from_cached_graph else "",
        )

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def input_names(self) -> list[str]:
        return list(self._inputs)

    @property
    def binds_io(self) -> bool:
        """Whether calls bind inputs and outputs. On the 2-core CPU plain `run` was as fast or faster
        (benchmarks/io_binding_bench.py, docs/benchmarks.md), so `auto` binds on CUDA only."""
        return self._binds_io

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._binds_io:
            return self.run_bound(feeds)  # host arrays in, host arrays out
        try:
            arrays = self._session.run(self._outputs, {k: feeds[k] for k in self._inputs})
        except Exception as e:  # ORT raises its own exception types
            raise EngineError(f"ONNX Runtime failed: {e}") from e
        return dict(zip(self._outputs, arrays, strict=True))

    def run_bound(self, feeds: dict[str, Feed], keep: Collection[str] = ()) -> dict[str, Feed]:
        """One call through IO binding. Host arrays are copied to the device by ONNX Runtime, OrtValues
        (already there) are used as they are; outputs named in `keep` stay on the device as OrtValues (the
        next call's inputs), the others come back as host arrays."""
        binding = self._binding()
        device, device_id = self._device
        try:
            for name in self._inputs:
                value = feeds[name]
                if isinstance(value, ort.OrtValue):
                    binding.bind_ortvalue_input(name, value)
                else:
                    binding.bind_cpu_input(name, np.ascontiguousarray(value))
            for name in self._outputs:
                if name in keep:
                    binding.bind_output(name, device, device_id)
                else:
                    binding.bind_output(name, "cpu")  # ORT copies it to the host itself, once
            self._session.run_with_iobinding(binding)
            values = binding.get_outputs()
        except Exception as e:  # ORT raises its own exception types
            raise EngineError(f"ONNX Runtime failed: {e}") from e
        finally:  # drop the references to this call's arrays and values
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()
        return {
            name: value if name in keep else value.numpy()
            for name, value in zip(self._outputs, values, strict=True)
        }

    def to_device(self, array: np.ndarray) -> ort.OrtValue:
        """A copy of `array` on the session's device, for `run_bound`."""
        device, device_id = self._device
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), device, device_id)

    def companion(self, model: bytes) -> OrtEngine:
        """A session of `model` (serialized) on this engine's device, IO bound: a helper graph that works
        on this engine's device values, such as the KV cache's row gather."""
        on_cuda = self._provider == CUDA
        return OrtEngine(model, device="gpu" if on_cuda else "cpu", intra_op_threads=1, io_binding="on")

    def _binding(self) -> ort.IOBinding:
        binding = getattr(self._bindings, "binding", None)
        if binding is None:
            binding = self._bindings.binding = self._session.io_binding()
        return binding
