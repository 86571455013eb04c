"""HTTP routes: they translate between JSON and the service's domain, nothing more."""

from fastapi import APIRouter

from service.api import classify, health, models


def build_router() -> APIRouter:
    router = APIRouter()
    for module in (health, models, classify):
        router.include_router(module.router)
    return router
