"""Training tests run tiny models on shared CPUs: let idle OpenMP threads sleep (see training/__main__.py)."""

import os
from collections.abc import Iterator

import pytest
import torch

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Models this small run ~10x faster on one thread than on two contended ones (no spinning): a module
    asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
