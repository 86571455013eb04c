"""Triton's model configuration, model repository and statistics extensions, in Triton's JSON.

What `tritonclient.http`'s `get_model_config`, `get_model_repository_index` and `get_inference_statistics`
read, each derived from what is loaded, never from a config file: distilserve has none.

- Configuration: the v2 interface of `model_metadata` as Triton's `input`/`output` (dims without the batch
  axis: `max_batch_size` > 0 says the first axis is the batch), `max_batch_size` = the per-request cap
  (DISTILSERVE_MAX_CLIENT_BATCH), one instance group of the model's engine calls (`count`) on its
  provider (`kind`), the micro-batcher's extra wait as `max_queue_delay_microseconds`, and `version_policy`:
  `all` under DISTILSERVE_MODEL_CONTROL=none (every version in the repository is served), `latest` (1)
  under poll and explicit. An engine call may batch more sequences than one request holds (several
  requests' texts, QA's windows): `parameters.engine_max_batch_size` caps those.
- Repository: the index lists every version in the repository with its state (READY, LOADING, UNLOADING,
  UNAVAILABLE and the reason: broken, superseded, unloaded). Load and unload (service.model_control) under
  DISTILSERVE_MODEL_CONTROL=explicit; otherwise they answer 400 saying why.
- Statistics: `service.stats`, per request (every protocol) and per engine call, this process's only.
  Triton's shape; counts of queue and compute are the success count, as Triton's. compute_input is
  tokenization; compute_infer the engine calls a request took part in (padding the batch and slicing
  each item's outputs included, so compute_output is 0). Generation: its engine runs decode steps shared
  by many requests, so a request's queue and compute_infer are 0 ns; its prefill and decode calls are the
  executions. No response cache: cache_hit and cache_miss are 0.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.api.v2 import PLATFORM, find_model, model_metadata, served, v2_router
from service.api.v2_schemas import TensorError, TensorMetadata, describe_validation
from service.engine import CUDA
from service.ipc import Executions, IndexRow
from service.served import ServedModel
from service.settings import Settings
from service.stats import Duration, ModelStats
from service.tasks.contract import Collaborators

BACKEND = "onnxruntime"
PER_PROCESS = (
    "Requests are counted in the HTTP frontend that answered them, since it started: with "
    "DISTILSERVE_FRONTENDS > 1 a client reaches one frontend per connection, so those numbers are its "
    "share (/metrics sums the frontends). Engine calls (execution_count, batch_stats, last_inference) "
    "are the engine core's, shared by every frontend."
)

router = v2_router()


# -- model configuration ----------------------------------------------------------------------------------


class ConfigTensor(BaseModel):
    name: str
    data_type: str  # TYPE_STRING for BYTES, else TYPE_ + the v2 datatype
    dims: list[int]  # without the batch axis; -1 marks a variable dimension


class InstanceGroup(BaseModel):
    name: str
    kind: Literal["KIND_CPU", "KIND_GPU"]
    count: int
    gpus: list[int]


class DynamicBatching(BaseModel):
    preferred_batch_size: list[int]
    max_queue_delay_microseconds: int


class ModelConfig(BaseModel):
    """Triton's model configuration as its HTTP endpoint writes it (protobuf field names)."""

    name: str
    platform: str
    backend: str
    version_policy: dict[str, dict[str, int]]
    max_batch_size: int
    input: list[ConfigTensor]
    output: list[ConfigTensor]
    instance_group: list[InstanceGroup]
    dynamic_batching: DynamicBatching
    default_model_filename: str
    parameters: dict[str, dict[str, str]]


def _config_tensor(tensor: TensorMetadata) -> ConfigTensor:
    data_type = "TYPE_STRING" if tensor.datatype == "BYTES" else f"TYPE_{tensor.datatype}"
    return ConfigTensor(name=tensor.name, data_type=data_type, dims=tensor.shape[1:])


def model_config(model: ServedModel, settings: Settings) -> ModelConfig:
    metadata = model_metadata(model, [model.manifest.version])
    on_gpu = model.provider == CUDA
    generation = model.generator is not None
    engine_batch = settings.gen_max_batch if generation else settings.max_batch_size
    parameters = {
        "task": model.manifest.task,
        "variant": model.variant,
        "execution_provider": model.provider,
        "threads_per_instance": str(model.plan.threads),
        "max_sequence_length": str(model.manifest.max_sequence_length),
        "engine_max_batch_size": str(engine_batch),
    }
    if not generation:
        parameters["engine_max_batch_tokens"] = str(settings.max_batch_tokens)
    return ModelConfig(
        name=model.name,
        platform=PLATFORM,
        backend=BACKEND,
        version_policy={"all": {}} if settings.model_control == "none" else {"latest": {"num_versions": 1}},
        max_batch_size=settings.max_client_batch,
        input=[_config_tensor(t) for t in metadata.inputs],
        output=[_config_tensor(t) for t in metadata.outputs],
        instance_group=[
            InstanceGroup(
                name=model.name,
                kind="KIND_GPU" if on_gpu else "KIND_CPU",
                count=model.plan.instances,
                gpus=[0] if on_gpu else [],  # ONNX Runtime's CUDA provider runs on device 0 unless told
            )
        ],
        # Generation joins the running batch at the next decode step: it never waits for company.
        dynamic_batching=DynamicBatching(
            preferred_batch_size=[],
            max_queue_delay_microseconds=0 if generation else round(settings.max_wait_ms * 1000),
        ),
        default_model_filename=model.manifest.variants[model.variant].file,
        parameters={k: {"string_value": v} for k, v in parameters.items()},
    )


# -- statistics -------------------------------------------------------------------------------------------


class DurationStat(BaseModel):
    count: int
    ns: int


class InferenceStats(BaseModel):
    success: DurationStat
    fail: DurationStat
    queue: DurationStat
    compute_input: DurationStat
    compute_infer: DurationStat
    compute_output: DurationStat
    cache_hit: DurationStat
    cache_miss: DurationStat


class BatchStat(BaseModel):
    batch_size: int
    compute_input: DurationStat
    compute_infer: DurationStat
    compute_output: DurationStat


class ModelStat(BaseModel):
    name: str
    version: str
    last_inference: int  # ms since the epoch; 0: no engine call yet
    inference_count: int
    execution_count: int
    inference_stats: InferenceStats
    response_stats: dict[str, Any] = Field(default_factory=dict)  # decoupled models only: none here
    batch_stats: list[BatchStat]
    memory_usage: list[Any] = Field(default_factory=list)  # not measured


class StatsResponse(BaseModel):
    model_stats: list[ModelStat]


def _stat(count: int, ns: int = 0) -> DurationStat:
    return DurationStat(count=count, ns=ns)


def _batch_stat(size: int, calls: Duration) -> BatchStat:
    return BatchStat(
        batch_size=size,
        compute_input=_stat(calls.count),
        compute_infer=_stat(calls.count, calls.ns),
        compute_output=_stat(calls.count),
    )


def model_stat(model: ServedModel, engine: Executions | None) -> ModelStat:
    """This frontend's requests for the model, and the engine calls the engine core made for it (all
    frontends' requests share them)."""
    s: ModelStats = model.stats
    done = s.success.count
    batches = engine.batches if engine is not None else []
    return ModelStat(
        name=model.name,
        version=str(model.manifest.version),
        last_inference=engine.last_ms if engine is not None else 0,
        inference_count=s.inference_count,
        execution_count=engine.count if engine is not None else 0,
        inference_stats=InferenceStats(
            success=_stat(done, s.success.ns),
            fail=_stat(s.fail.count, s.fail.ns),
            queue=_stat(done, s.queue_ns),
            compute_input=_stat(done, s.compute_input_ns),
            compute_infer=_stat(done, s.compute_infer_ns),
            compute_output=_stat(done),
            cache_hit=_stat(0),
            cache_miss=_stat(0),
        ),
        batch_stats=[_batch_stat(size, Duration(count, ns)) for size, count, ns in batches],
    )


class Executing(Protocol):
    """What the statistics need of the engine connection (service.app)."""

    async def executions(self) -> list[Executions]: ...


async def stats_of(engine: Executing, models: list[ServedModel]) -> StatsResponse:
    executions = {(e.name, e.version): e for e in await engine.executions()}
    return StatsResponse(
        model_stats=[model_stat(m, executions.get((m.name, m.manifest.version))) for m in models]
    )


# -- repository index -------------------------------------------------------------------------------------


class IndexRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ready: bool = False  # only ready models: every served one is


class IndexEntry(BaseModel):
    name: str
    version: str
    state: Literal["READY", "LOADING", "UNLOADING", "UNAVAILABLE"]
    reason: str = ""


def _index_request(body: bytes) -> IndexRequest:
    """tritonclient sends an empty body; others `{"ready": true}`."""
    if not body.strip():
        return IndexRequest()
    try:
        return IndexRequest.model_validate_json(body)
    except ValidationError as e:
        raise TensorError(describe_validation(e)) from None


# -- routes -----------------------------------------------------------------------------------------------


@router.get(
    "/models/stats",
    response_model=StatsResponse,
    summary="Statistics of every served model version (requests: this frontend's; engine calls: all).",
    description=PER_PROCESS,
)
async def all_model_stats(request: Request, c: Collaborators = Depends(served)) -> StatsResponse:
    return await stats_of(request.app.state.engine, c.registry.all())


@router.get(
    "/models/{name}/stats",
    response_model=StatsResponse,
    summary="Statistics of every served version of a model (requests: this frontend's; engine calls: all).",
    description=PER_PROCESS,
)
async def model_stats(name: str, request: Request, c: Collaborators = Depends(served)) -> StatsResponse:
    return await stats_of(request.app.state.engine, c.registry.versions(name))


@router.get(
    "/models/{name}/versions/{version}/stats",
    response_model=StatsResponse,
    summary="Statistics of one model version (requests: this frontend's; engine calls: all).",
    description=PER_PROCESS,
)
async def model_version_stats(
    name: str, version: str, request: Request, c: Collaborators = Depends(served)
) -> StatsResponse:
    return await stats_of(request.app.state.engine, [find_model(c.registry, name, version)])


@router.get(
    "/models/{name}/config",
    response_model=ModelConfig,
    summary="Model configuration (Triton's JSON) of the highest version.",
)
async def get_model_config(name: str, c: Collaborators = Depends(served)) -> ModelConfig:
    return model_config(find_model(c.registry, name, None), c.settings)


@router.get(
    "/models/{name}/versions/{version}/config",
    response_model=ModelConfig,
    summary="Model configuration (Triton's JSON) of one version.",
)
async def get_model_version_config(
    name: str, version: str, c: Collaborators = Depends(served)
) -> ModelConfig:
    return model_config(find_model(c.registry, name, version), c.settings)


@router.post(
    "/repository/index",
    response_model=list[IndexEntry],
    summary="Every model version in the repository and its state (READY, LOADING, UNLOADING, UNAVAILABLE "
    'with the reason); the body may be empty or {"ready": true} (READY ones only).',
)
async def repository_index(request: Request, c: Collaborators = Depends(served)) -> list[IndexEntry]:
    ready = _index_request(await request.body()).ready
    return index_of(request.app.state.engine, ready)


class Indexed(Protocol):
    def index(self) -> list[IndexRow]: ...


def index_of(engine: Indexed, ready_only: bool = False) -> list[IndexEntry]:
    rows = engine.index()
    return [
        IndexEntry(name=r.name, version=str(r.version), state=r.state, reason=r.reason)  # type: ignore[arg-type]
        for r in rows
        if r.state == "READY" or not ready_only
    ]


@router.post(
    "/repository/models/{name}/load",
    summary="Load a model's highest valid version (DISTILSERVE_MODEL_CONTROL=explicit); it takes the "
    "traffic once validated and warm, the version it supersedes drains and is unloaded.",
)
async def load_model(name: str, request: Request, c: Collaborators = Depends(served)) -> JSONResponse:
    """Errors (service.model_control): 400 when the mode or the version refuses it, 404 for a model the
    repository does not hold, 503 while the engine is away."""
    await request.app.state.engine.control("load", name)
    return JSONResponse({})


@router.post(
    "/repository/models/{name}/unload",
    summary="Drain and unload every version of a model (DISTILSERVE_MODEL_CONTROL=explicit).",
)
async def unload_model(name: str, request: Request, c: Collaborators = Depends(served)) -> JSONResponse:
    await request.app.state.engine.control("unload", name)
    return JSONResponse({})
