"""Optional API keys: /v1 and /v2 need `Authorization: Bearer <key>`; probes and docs stay open."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from service.api import auth
from service.app import StartupError, create_app
from service.settings import Settings

KEYS = ("alpha-key", "beta-key", "gamma-key")
OPEN = ("/health", "/ready", "/metrics", "/docs", "/openapi.json", "/v2/health/live", "/v2/health/ready")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _client(repository: Path, **knobs: object) -> Iterator[TestClient]:
    settings = Settings(model_repository=repository, warmup=False, **knobs)
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def client(tiny_repository: Path) -> Iterator[TestClient]:
    yield from _client(tiny_repository, api_keys=SecretStr(",".join(KEYS)))


@pytest.fixture(scope="module")
def metrics_protected(tiny_repository: Path) -> Iterator[TestClient]:
    yield from _client(tiny_repository, api_keys=SecretStr("only-key"), protect_metrics=True)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models"),
        ("POST", "/v1/classify"),
        ("GET", "/v2/models/tiny-cls"),
        ("POST", "/predict"),
        ("POST", "/tokenize"),
        ("GET", "/info"),
        ("POST", "/detokenize"),
        ("GET", "/tokenizer_info"),
    ],
)
def test_no_key_is_401_with_a_bearer_challenge(client: TestClient, method: str, path: str) -> None:
    r = client.request(method, path, json={"inputs": "a fine film"})
    assert r.status_code == 401 and "X-Request-ID" in r.headers
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert r.json() == {
        "error": "an API key is required: send Authorization: Bearer <key>",
        "error_type": "unauthorized",
    }


@pytest.mark.parametrize("header", ["Bearer wrong-key", "Bearer alpha-key-and-more", "Basic alpha-key", ""])
def test_a_wrong_key_is_401(client: TestClient, header: str) -> None:
    r = client.get("/v1/models", headers={"Authorization": header})
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"].startswith("Bearer")


def test_every_key_opens_the_api(client: TestClient) -> None:
    for key in KEYS:
        r = client.post("/v1/classify", json={"inputs": "a fine film"}, headers=bearer(key))
        assert r.status_code == 200, r.text
    assert client.get("/v1/models", headers={"Authorization": f"bearer  {KEYS[1]} "}).status_code == 200


def test_keys_are_compared_in_constant_time_against_every_key(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert client.get("/v1/models", headers=bearer(KEYS[0])).status_code == 200
    assert len(calls) == len(KEYS)  # the first key matched, and the others were still compared
    assert all(len(a) == len(b) == 32 for a, b in calls)  # digests: the key lengths do not show
    calls.clear()
    assert client.get("/v1/models", headers=bearer("nope")).status_code == 401
    assert len(calls) == len(KEYS)


@pytest.mark.parametrize("path", OPEN)
def test_probes_metrics_and_docs_stay_open(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 200


def test_protect_metrics_closes_metrics_only(metrics_protected: TestClient) -> None:
    assert metrics_protected.get("/metrics").status_code == 401
    assert metrics_protected.get("/metrics", headers=bearer("only-key")).status_code == 200
    for path in ("/health", "/ready", "/docs", "/openapi.json"):
        assert metrics_protected.get(path).status_code == 200


def test_without_keys_nothing_is_protected(tiny_repository: Path) -> None:
    for client in _client(tiny_repository):
        assert client.get("/v1/models").status_code == 200


def test_keys_come_from_env_and_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# rotated 2026-11\nfile-key-1\n\n  file-key-2  \n")
    monkeypatch.setenv("DISTILSERVE_API_KEYS", " env-key , ,file-key-1")
    monkeypatch.setenv("DISTILSERVE_API_KEYS_FILE", str(keys_file))
    settings = Settings()
    assert auth.load_api_keys(settings) == ("env-key", "file-key-1", "file-key-2")
    assert "env-key" not in repr(settings)  # a secret: never printed with the settings


def test_a_bad_keys_file_stops_start_up(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n")
    with pytest.raises(StartupError, match="holds no key"):
        create_app(Settings(api_keys_file=empty))
    with pytest.raises(StartupError, match="cannot read the API keys file"):
        create_app(Settings(api_keys_file=tmp_path / "missing"))
