"""HTTP routes: they translate between JSON and the service's domain, nothing more."""

from fastapi import APIRouter

from service.api import classify, fill_mask, generate, health, models, qa, v2


def build_router() -> APIRouter:
    router = APIRouter()
    for module in (health, models, classify, qa, fill_mask, generate):
        router.include_router(module.router)
    router.include_router(v2.router)  # Open Inference Protocol v2 (KServe / Triton)
    return router
