"""HTTP routes: they translate between JSON and the service's domain, nothing more."""

from fastapi import FastAPI

from service.api import classify, fill_mask, generate, health, models, qa, v2


def add_routes(app: FastAPI) -> None:
    """Every route on the app's own router, the task endpoints first.

    Each `include_router` is a level FastAPI walks on every request (matching through nested routers
    cost ~100 us of a ~1 ms request here); the routes already carry their routers' dependencies, tags and
    route classes, so they are added flat, in the order they are most often matched.
    """
    for module in (classify, qa, fill_mask, generate, v2, models, health):
        app.router.routes.extend(module.router.routes)
