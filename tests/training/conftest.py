"""Training tests run tiny models on shared CPUs: let idle OpenMP threads sleep (see training/__main__.py)."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
