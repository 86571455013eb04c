"""HTTP routes: they translate between JSON and the service's domain, nothing more."""

from fastapi import FastAPI

from service.api import health, models, tei, tokenizer, v2, v2_extensions, v2_generate
from service.api.task_route import task_routes


def add_routes(app: FastAPI) -> None:
    """Every route on the app's own router, the task endpoints (service.tasks) first.

    Each `include_router` is a level FastAPI walks on every request (matching through nested routers
    cost ~100 us of a ~1 ms request here); the routes already carry their routers' dependencies, tags and
    route classes, so they are added flat, in the order they are most often matched (each route a request
    passes costs it ~1 us). v2's extensions go before v2's reads: `GET /v2/models/stats` is the statistics
    of every model, not the metadata of a model named "stats" (Triton reserves the name the same way).
    """
    app.router.routes.extend(task_routes())
    routers = (
        v2.infer_router,
        v2_generate.router,
        v2_extensions.router,
        v2.router,
        models.router,
        tei.router,
        tokenizer.router,
        health.router,
    )
    for router in routers:
        app.router.routes.extend(router.routes)
