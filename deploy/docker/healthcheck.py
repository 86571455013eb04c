"""Container healthcheck: exit 0 when the local service answers 200 on /ready, 1 otherwise.

A script rather than `curl`: the runtime images carry Python but no curl, and the port comes from
`DISTILSERVE_PORT` (exec-form HEALTHCHECKs expand no variables). /ready, not /health: a replica that is
still warming up or draining for shutdown must not receive traffic.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def ready(port: int, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):  # refused, 503 (HTTPError), timeout
        return False


def main() -> int:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("DISTILSERVE_PORT", "8000"))
    return 0 if ready(port) else 1


if __name__ == "__main__":
    sys.exit(main())
