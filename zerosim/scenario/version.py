"""DeepSpeed version strings, compared as tuples."""

from __future__ import annotations

import re

from zerosim.behaviours import Version, format_version
from zerosim.errors import ScenarioError

__all__ = ["Version", "format_version", "parse_version"]

_VERSION = re.compile(r"^(\d{1,9})\.(\d{1,9})\.(\d{1,9})(?!\d)")


def parse_version(text: object, *, source: str = "<inline>",
                  key_path: str = "runtime.deepspeed_version") -> Version:
    match = _VERSION.match(str(text)) if isinstance(text, str) else None
    if match is None:
        raise ScenarioError(source, key_path, "a DeepSpeed version like \"0.13.3\" (quote it)",
                            text)
    return int(match[1]), int(match[2]), int(match[3])
