"""Which served model answers a request: by task, optional name and optional pinned version."""

from __future__ import annotations

from collections import defaultdict

from service.served import ServedModel


class ModelNotFoundError(LookupError):
    """No such model or version (HTTP 404)."""


class WrongTaskError(ValueError):
    """The named model exists but serves another task (HTTP 422)."""


class AmbiguousModelError(ValueError):
    """A version was pinned without naming the model, and several serve the task (HTTP 422)."""


class ModelRegistry:
    """Name -> versions; without a pinned version the highest one answers."""

    def __init__(self, models: list[ServedModel]) -> None:
        self._by_name: dict[str, dict[int, ServedModel]] = defaultdict(dict)
        for m in models:
            self._by_name[m.name][m.manifest.version] = m
        self._by_task: dict[str, list[str]] = defaultdict(list)  # task -> the names serving it, sorted
        for name in self.names():
            self._by_task[self.get(name).manifest.task].append(name)

    def all(self) -> list[ServedModel]:
        return [versions[v] for _, versions in sorted(self._by_name.items()) for v in sorted(versions)]

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def get(self, name: str, version: int | None = None) -> ServedModel:
        versions = self._by_name.get(name)
        if not versions:
            known = ", ".join(self.names()) or "none"
            raise ModelNotFoundError(f"model {name!r} is not served (served: {known})")
        if version is None:
            return versions[max(versions)]
        if version not in versions:
            raise ModelNotFoundError(f"model {name!r} has no version {version} (has {sorted(versions)})")
        return versions[version]

    def versions(self, name: str) -> list[ServedModel]:
        """Every served version of `name`, lowest first (ModelNotFoundError when it is not served)."""
        self.get(name)
        versions = self._by_name[name]
        return [versions[v] for v in sorted(versions)]

    def resolve(self, task: str, name: str | None = None, version: int | None = None) -> ServedModel:
        """The pinned model, else the first model (by name) serving `task`.

        A version without a name pins the task's only model; with several, which one it meant is a guess,
        so the client is asked to name it."""
        if name is not None:
            model = self.get(name, version)
            if model.manifest.task != task:
                raise WrongTaskError(f"model {name!r} serves {model.manifest.task}, not {task}")
            return model
        serving = self._by_task.get(task)
        if not serving:
            raise ModelNotFoundError(f"no model serving {task} is loaded")
        if version is not None and len(serving) > 1:
            raise AmbiguousModelError(
                f"version {version} of which model? {len(serving)} serve {task} ({', '.join(serving)}): "
                "name one with 'model'"
            )
        return self.get(serving[0], version)
