"""DeepSpeed version strings: releases only, compared as tuples."""

from __future__ import annotations

import re
import warnings

from zerosim.behaviours import Version, format_version, resolve_behaviours
from zerosim.errors import ScenarioError, ScenarioWarning

__all__ = ["NEWEST_RELEASE", "Version", "VersionWarning", "format_version", "is_release",
           "parse_version", "version_label"]

# "0.13.3", or a build of it with a local label as `deepspeed.__version__` prints one from a
# source build ("0.13.3+5ab4b4bd"). At most 9 digits a part: a 5000-digit one is refused, not
# converted.
_VERSION = re.compile(r"^(\d{1,9})\.(\d{1,9})\.(\d{1,9})(\+[0-9A-Za-z.]+)?$")

# The last patch of each (major, minor) DeepSpeed has released: the git tags v0.1.0 to v0.19.5
# of deepspeedai/DeepSpeed (every minor's patches run from 0 without a gap).
LAST_PATCH: dict[tuple[int, int], int] = {
    (0, 1): 0, (0, 2): 0, (0, 3): 16, (0, 4): 5, (0, 5): 10, (0, 6): 7, (0, 7): 7, (0, 8): 3,
    (0, 9): 5, (0, 10): 3, (0, 11): 2, (0, 12): 6, (0, 13): 5, (0, 14): 5, (0, 15): 4,
    (0, 16): 9, (0, 17): 6, (0, 18): 9, (0, 19): 5,
}
NEWEST_RELEASE: Version = max((major, minor, patch)
                              for (major, minor), patch in LAST_PATCH.items())


class VersionWarning(ScenarioWarning):
    """A DeepSpeed version newer than the newest release zerosim knows."""


def is_release(version: Version) -> bool:
    major, minor, patch = version
    return patch <= LAST_PATCH.get((major, minor), -1)


def _newer_than_known(version: Version, source: str, key_path: str) -> None:
    behaviours = resolve_behaviours(version).describe()
    used = ", ".join(name for name, on in behaviours.items() if on)
    newest = format_version(NEWEST_RELEASE)
    warnings.warn(f"{source}: {key_path}: {format_version(version)} is newer than the newest "
                  f"DeepSpeed release zerosim knows ({newest}); replaying the behaviours of "
                  f"{newest}: {used}", VersionWarning, stacklevel=4)


def version_label(text: object) -> str:
    """The local label of a source build's version (`0.13.3+4570a955` -> `4570a955`), or ""."""
    match = _VERSION.match(text) if isinstance(text, str) else None
    return match[4][1:] if match is not None and match[4] else ""


def parse_version(text: object, *, source: str = "<inline>",
                  key_path: str = "runtime.deepspeed_version") -> Version:
    """A DeepSpeed release; one newer than every release zerosim knows is a warning."""
    match = _VERSION.match(text) if isinstance(text, str) else None
    if match is None:
        raise ScenarioError(source, key_path, "a DeepSpeed version like \"0.13.3\" (quote it)",
                            text)
    version = int(match[1]), int(match[2]), int(match[3])
    if version > NEWEST_RELEASE:
        _newer_than_known(version, source, key_path)
    elif not is_release(version):
        raise ScenarioError(source, key_path, _release_expected(version), text)
    return version


def _release_expected(version: Version) -> str:
    known = f"a DeepSpeed release (0.1.0 to {format_version(NEWEST_RELEASE)}"
    last = LAST_PATCH.get(version[:2])
    if last is None:
        return known + ")"
    major, minor = version[:2]
    return f"{known}; {major}.{minor}.x ends at {major}.{minor}.{last})"
