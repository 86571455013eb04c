"""Optional API keys (pure ASGI, so routes stay unaware): `Authorization: Bearer <key>` on /v1, /v2, TEI's
paths (/embed, /predict, /tokenize, /info) and vLLM's tokenizer routes (/detokenize, /tokenizer_info).

Probes and docs stay open (a load balancer or an orchestrator has no key); /metrics too unless
`protect_metrics`. Keys are compared in constant time against every key, as SHA-256 digests, so neither
the time to answer nor the key lengths say anything about how close a guess came. The gRPC service checks
the same keys in its `authorization` metadata (service.api.grpc_v2), with the same answers (`refusal`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.errors import TEI_PATHS, UnauthorizedError, response_for
from service.settings import Settings

PROTECTED_PREFIXES = ("/v1/", "/v2/")
TOP_LEVEL_PATHS = ("/info", "/detokenize", "/tokenizer_info")  # TEI's and vLLM's routes outside /v1
CHALLENGE = 'Bearer realm="distilserve"'


def load_api_keys(settings: Settings) -> tuple[str, ...]:
    """The keys from DISTILSERVE_API_KEYS and DISTILSERVE_API_KEYS_FILE; a named file must hold one."""
    keys = [k.strip() for k in settings.api_keys.get_secret_value().split(",") if k.strip()]
    path = settings.api_keys_file
    if path is not None:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ValueError(f"cannot read the API keys file {path}: {e.strerror or e}") from e
        from_file = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not from_file:
            raise ValueError(f"the API keys file {path} holds no key")
        keys += from_file
    return tuple(dict.fromkeys(keys))


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def key_matches(given: str, digests: Sequence[bytes]) -> bool:
    """Compares with every key, never stopping at a match."""
    candidate = _digest(given)
    matched = False
    for digest in digests:
        matched |= hmac.compare_digest(candidate, digest)
    return matched


def digests(keys: Sequence[str]) -> tuple[bytes, ...]:
    return tuple(_digest(k) for k in keys)


def bearer_token(headers: Headers) -> str | None:
    return bearer_of(headers.get("authorization", ""))


def bearer_of(authorization: str) -> str | None:
    """The key of an `Authorization: Bearer <key>` value (an HTTP header or gRPC metadata), else None."""
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def refusal(token: str | None, known: Sequence[bytes]) -> UnauthorizedError | None:
    """Why a request with this key is refused (none given, or not ours); None when it may pass. One
    wording for HTTP and gRPC."""
    if token is None:
        return UnauthorizedError("an API key is required: send Authorization: Bearer <key>", CHALLENGE)
    if not key_matches(token, known):
        return UnauthorizedError("the API key is not valid", f'{CHALLENGE}, error="invalid_token"')
    return None


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: Sequence[str], protect_metrics: bool = False) -> None:
        if not keys:
            raise ValueError("ApiKeyMiddleware needs at least one key")
        self.app = app
        self._digests = digests(keys)
        self._protect_metrics = protect_metrics

    def protects(self, path: str) -> bool:
        if path.startswith("/v2/health/"):  # liveness/readiness probes (Kubernetes) carry no key
            return False
        if path.startswith(PROTECTED_PREFIXES) or path in ("/v1", "/v2", *TOP_LEVEL_PATHS, *TEI_PATHS):
            return True
        return self._protect_metrics and (path == "/metrics" or path.startswith("/metrics/"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.protects(scope["path"]):
            await self.app(scope, receive, send)
            return
        error = refusal(bearer_token(Headers(scope=scope)), self._digests)
        if error is None:
            await self.app(scope, receive, send)
            return
        response = response_for(error, scope["path"])
        assert response is not None
        await response(scope, receive, send)
