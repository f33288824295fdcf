"""Errors that explain themselves: which file, which key, what was expected, what was given."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ZerosimError(Exception):
    """Base class for every error zerosim raises on purpose."""


class ScenarioError(ZerosimError, ValueError):
    """Invalid user input: a scenario, a hardware profile, a ds_config or an override."""

    def __init__(self, source: str | Path | None, key_path: str, expected: str, got: Any):
        self.source = str(source) if source is not None else "<inline>"
        self.key_path = key_path or "<root>"
        self.expected = expected
        self.got = got
        super().__init__(
            f"{self.source}: {self.key_path}: expected {expected}, got {_show(got)}"
        )


class UnsupportedConfigError(ScenarioError):
    """A configuration zerosim refuses: DeepSpeed would refuse it too, or zerosim does not
    model it (yet). Decided once, when the scenario is resolved (`zerosim.scenario.support`),
    so `check`, `sweep` and `run` agree."""


class ScenarioWarning(UserWarning):
    """Something about an input worth telling the user, naming the field; nothing is refused.
    The CLI prints each once on stderr as `warning: ...`."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
