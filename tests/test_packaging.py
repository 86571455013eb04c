"""The serving install stays small: base + [cpu] pulls no torch, transformers or optimum."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import requires

HEAVY = {"torch", "transformers", "optimum", "optimum-onnx", "accelerate"}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def requirements_for(extra: str | None) -> set[str]:
    names = set()
    for req in requires("distilserve") or []:
        marker = req.split(";", 1)[1] if ";" in req else ""
        if not marker or (extra is not None and f'extra == "{extra}"' in marker):
            names.add(_name(req))
    return names


def test_serving_install_pulls_nothing_heavy() -> None:
    serving = requirements_for("cpu")
    assert {"fastapi", "onnxruntime", "tokenizers", "prometheus-client"} <= serving
    assert not serving & HEAVY


def test_cpu_and_gpu_runtimes_are_separate_extras() -> None:
    assert "onnxruntime-gpu" not in requirements_for("cpu")
    assert "onnxruntime" not in requirements_for("gpu")
    assert "onnxruntime" not in requirements_for("export")  # optimum-onnx without its [onnxruntime] extra


def test_the_serving_path_imports_no_training_libraries() -> None:
    code = (
        "import sys, service.app, service.__main__, service.api.grpc_v2\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'transformers', 'optimum'})\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
