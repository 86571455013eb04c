"""`make loadtest`: a headless locust run against the service, then its report.

    python -m loadtests.run --port 8000 --time 2m --users 32 --spawn-rate 8

If nothing answers on HOST:PORT, the service is started on MODEL_REPOSITORY (and stopped afterwards;
its log goes to service.log in the report folder); a service that answers is used as it is. The run
writes loadtests/reports/<timestamp>/: locust's CSVs and HTML page, report.md, latency.png and
throughput.png. Exit status 1 when any request failed other than with a 429 (queue full), a deliberate
bad request's 4xx being a success.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from importlib.metadata import version
from pathlib import Path

import httpx

from loadtests.report import write_report

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def answers(base_url: str) -> bool:
    try:
        httpx.get(f"{base_url}/health", timeout=2)
    except httpx.TransportError:
        return False
    return True


def wait_ready(base_url: str, timeout_s: float, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise SystemExit(f"the service exited with {process.returncode} before it was ready")
        try:
            if httpx.get(f"{base_url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{base_url}/ready did not answer 200 within {timeout_s:.0f} s")


@contextmanager
def launched(
    host: str,
    port: int,
    repository: Path,
    log: Path,
    ready_timeout_s: float,
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m service` on host:port, started here once ready, drained and stopped when the block ends."""
    if not repository.is_dir():
        raise SystemExit(f"{repository} is no model repository (make models): nothing to serve")
    command = [sys.executable, "-m", "service", "--host", host, "--port", str(port)]
    command += ["--model-repository", str(repository)]
    print(f"starting {shlex.join(command)} (log: {log})")
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        try:
            wait_ready(f"http://{host}:{port}", ready_timeout_s, process)
            yield process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # drains: queued requests finish first
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@contextmanager
def service(host: str, port: int, repository: Path, log: Path, ready_timeout_s: float) -> Iterator[str]:
    """The service on host:port: the one already answering there, else one started (and stopped) here."""
    base_url = f"http://{host}:{port}"
    if answers(base_url):
        print(f"using the service that answers on {base_url}")
        wait_ready(base_url, ready_timeout_s)
        yield base_url
        return
    with launched(host, port, repository, log, ready_timeout_s):
        yield base_url


def served_models(base_url: str) -> str:
    """What the service serves, in one line (for a report's header)."""
    models = httpx.get(f"{base_url}/v1/models", timeout=10)
    served = ", ".join(
        f"{m['name']} v{m['version']} ({m['variant']}, {m['provider']})"
        for m in (models.json()["models"] if models.status_code == 200 else [])
    )
    return served or "unknown (GET /v1/models failed)"


def locust_command(base_url: str, users: int, spawn_rate: float, run_time: str, out: Path) -> list[str]:
    """Headless locust with the locustfile's mixed traffic; its CSVs (with history) and HTML page in `out`."""
    prefix = out / "locust"
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", base_url, "--headless"]
    command += ["--users", str(users), "--spawn-rate", str(spawn_rate), "--run-time", run_time]
    command += ["--csv", str(prefix), "--csv-full-history", "--html", str(out / "locust.html")]
    command += ["--only-summary", "--stop-timeout", "30", "--loglevel", "WARNING"]
    return command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.run", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model-repository", type=Path, default=Path("models"))
    parser.add_argument("--time", default="2m", help="locust --run-time: 30s, 2m, 1h ...")
    parser.add_argument("--users", type=int, default=32, help="concurrent users")
    parser.add_argument("--spawn-rate", type=float, default=8, help="users started per second")
    parser.add_argument("--reports", type=Path, default=Path("loadtests/reports"))
    parser.add_argument("--ready-timeout", type=float, default=300, help="seconds to wait for /ready")
    args = parser.parse_args(argv)

    started = datetime.now()
    out = args.reports / started.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=False)
    prefix = out / "locust"
    with service(args.host, args.port, args.model_repository, out / "service.log", args.ready_timeout) as url:
        served = served_models(url)
        locust = locust_command(url, args.users, args.spawn_rate, args.time, out)
        print(shlex.join(locust))
        subprocess.run(locust, check=False)  # exits 1 on any failure, 429s included: the report judges
    if not Path(f"{prefix}_stats.csv").exists():
        print("locust wrote no stats: see its output above", file=sys.stderr)
        return 2
    run = {
        "started": started.isoformat(timespec="seconds"),
        "target": url,
        "models": served,
        "users": f"{args.users} (spawn rate {args.spawn_rate}/s), run time {args.time}",
        "locust": version("locust"),
    }
    report = write_report(prefix, out, run)
    total = report.total
    print(
        f"\n{report.markdown}: {total.requests} requests at {total.rps:.1f}/s, p50 {total.p50} ms, "
        f"p95 {total.p95} ms, p99 {total.p99} ms; 429: {total.too_many}; other failures: "
        f"{report.unexpected_failures}"
    )
    return 1 if report.unexpected_failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
