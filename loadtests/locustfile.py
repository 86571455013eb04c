"""Classification traffic for locust (first scenario; the deployment issue adds the other endpoints).

.venv/bin/locust -f loadtests/locustfile.py --host http://127.0.0.1:8000 --headless -u 16 -r 16 -t 30s
"""

from __future__ import annotations

import random

from locust import HttpUser, between, task

from loadtests.texts import review


class ClassifyUser(HttpUser):
    wait_time = between(0.0, 0.05)

    def on_start(self) -> None:
        self.rng = random.Random()

    @task(10)
    def classify_one(self) -> None:
        self.client.post("/v1/classify", json={"inputs": review(self.rng)}, name="/v1/classify")

    @task(2)
    def classify_batch(self) -> None:
        texts = [review(self.rng) for _ in range(self.rng.randint(2, 8))]
        self.client.post("/v1/classify", json={"inputs": texts, "top_k": 2}, name="/v1/classify [list]")

    @task(1)
    def bad_request(self) -> None:
        body = {"inputs": ""}
        with self.client.post("/v1/classify", json=body, catch_response=True, name="bad input") as r:
            if r.status_code == 422:
                r.success()
            else:
                r.failure(f"empty text should be 422, got {r.status_code}")
