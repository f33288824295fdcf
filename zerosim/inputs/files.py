"""Reading the files a user names: an explicit encoding, kind and size checks, clear errors.

Every input file (scenario, ds_config, hardware profile, Hugging Face config.json, sweep spec)
is read here: it must be a regular file (not a directory, a FIFO or a device; a symlink loop is
named as one), at most `MAX_INPUT_BYTES` long, and UTF-8 text (a byte-order mark is allowed).
A problem is a `ScenarioError` naming the file that refers to it and the key that does, or the
file itself when it was named on the command line.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from zerosim.errors import Described, ScenarioError
from zerosim.shipped import shipped_copy

MAX_INPUT_BYTES = 1 << 20
"""The largest input file read (1 MiB): scenarios, profiles and configs are a few KiB."""
MAX_PATH_CHARS = 4096
"""The longest path a scenario may name (Linux's PATH_MAX)."""

BYTE_ORDER_MARKS = {
    b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32",
    b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16",
}


def referenced_path(base_dir: Path, value: Any, *, source: str, key_path: str,
                    what: str) -> Path:
    """The path a scenario key gives (`{file: ...}`, `hf_config: ...`), relative to the
    scenario's folder, checked to be a usable path text (not empty, no NUL, not too long)."""
    expected = f"the path of {what}, relative to the scenario's folder"
    if not isinstance(value, str):
        raise ScenarioError(source, key_path, expected, value)
    if not value.strip():
        raise ScenarioError(source, key_path, expected, Described("an empty path"))
    if "\0" in value or len(value) > MAX_PATH_CHARS:
        raise ScenarioError(source, key_path, f"{expected} (at most {MAX_PATH_CHARS} "
                            "characters, no NUL)", value)
    return Path(base_dir) / value


def read_input_text(path: str | Path, *, referenced_from: str | None = None,
                    key_path: str = "<root>", what: str = "file") -> str:
    """The text of the input file `path`, decoded as UTF-8.

    `referenced_from` and `key_path` say where the path was given (the scenario and its key);
    without them the file itself is named.
    """
    path = Path(path)
    where = referenced_from or str(path)
    _check_kind(path, where, key_path, what)
    data = _read_bounded(path, where, key_path, what)
    return _decode(data, path, where, key_path)


def _check_kind(path: Path, where: str, key_path: str, what: str) -> None:
    try:
        info = os.stat(path)
    except OSError as err:
        reason = _os_reason(err)
        if err.errno == errno.ENOENT and (copy := shipped_copy(path)) is not None:
            reason += f"; zerosim ships one at {_quoted(copy)}"
        raise ScenarioError(where, key_path, f"an existing {what}",
                            Described(f"{_quoted(path)} ({reason})")) from None
    if stat.S_ISDIR(info.st_mode):
        raise ScenarioError(where, key_path, f"a {what}, not a folder",
                            Described(f"{_quoted(path)} (a folder)"))
    if not stat.S_ISREG(info.st_mode):
        raise ScenarioError(where, key_path, f"a regular {what}",
                            Described(f"{_quoted(path)} ({_kind_name(info.st_mode)})"))
    if info.st_size > MAX_INPUT_BYTES:
        raise ScenarioError(where, key_path, f"a {what} of at most {MAX_INPUT_BYTES} bytes",
                            Described(f"{_quoted(path)} ({info.st_size} bytes)"))


def _read_bounded(path: Path, where: str, key_path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as err:
        raise ScenarioError(where, key_path, f"a readable {what}",
                            Described(f"{_quoted(path)} ({_os_reason(err)})")) from None
    if len(data) > MAX_INPUT_BYTES:
        raise ScenarioError(where, key_path, f"a {what} of at most {MAX_INPUT_BYTES} bytes",
                            Described(f"{_quoted(path)} (more)"))
    return data


def _decode(data: bytes, path: Path, where: str, key_path: str) -> str:
    for mark, encoding in BYTE_ORDER_MARKS.items():
        if data.startswith(mark):
            raise ScenarioError(where, key_path, "UTF-8 text",
                                Described(f"{_quoted(path)} ({encoding} text)"))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        byte = data[err.start]
        raise ScenarioError(where, key_path, "UTF-8 text", Described(
            f"{_quoted(path)} (byte 0x{byte:02x} at offset {err.start} is not UTF-8)")) from None


def _quoted(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 120 else "..." + text[-117:]


def _os_reason(err: OSError) -> str:
    if err.errno == errno.ELOOP:
        return "a symlink loop"
    if err.errno == errno.ENOENT:
        return "no such file"
    if err.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a folder"
    if err.errno == errno.ENAMETOOLONG:
        return "the name is too long"
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return err.strerror or type(err).__name__


def _kind_name(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"
