"""HTTP routes: they translate between JSON and the service's domain, nothing more."""

from fastapi import APIRouter

from service.api import classify, fill_mask, generate, health, models, qa


def build_router() -> APIRouter:
    router = APIRouter()
    for module in (health, models, classify, qa, fill_mask, generate):
        router.include_router(module.router)
    return router
