"""Output folders: checked before anything is simulated, published whole or not at all.

`check_output_folder` refuses, up front, a folder that could not be written at the end: a
path through a file, a name too long for the filesystem, a folder that cannot be written, the
current folder or one of its parents, or an existing folder that holds files zerosim did not
write (they would be replaced). `staged_folder` gives a temporary folder beside the target;
when the block ends normally the target is replaced by it in one rename (signals held back
meanwhile), so an interrupted or failed run leaves the previous complete output, or nothing.
`atomic_write` does the same for one file of a command that adds files to its folder.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from zerosim.errors import ZerosimError, clip
from zerosim.inputs.plausible import FOLDER_NAME_MAX_BYTES
from zerosim.interrupts import deferred_interrupts

if TYPE_CHECKING:
    import pandas as pd

STAGING_PREFIX = ".zerosim-staging-"
"""With 8 hex digits after it, the temporary folder's name: an output folder's name may take
what else a file name may have (`inputs.plausible.FOLDER_NAME_MAX_BYTES`)."""
RETIRED_PREFIX = ".zerosim-previous-"
NAME_MAX_BYTES = 255    # longest file name on Linux and macOS filesystems
PATH_MAX_BYTES = 4096
RESULT_FILE = re.compile(
    r"^(?:(?:summary|capacities|scenario|trace)\.json"
    r"|(?:spans|memory|phases|links|peer_waits)\.(?:csv|parquet)|critical_path\.csv"
    r"|[\w.-]+\.(?:png|svg|pdf))$")
"""Names of the files `zerosim run` writes (tables, JSON, figures)."""
MARKER_FILE = "summary.json"


class OutputFolderError(ZerosimError):
    """An output folder that cannot take the output: said before anything is simulated."""

    def __init__(self, option: str, path: Path, expected: str, got: str):
        self.path = path
        super().__init__(f"{option} {clip(str(path), 200)}: expected {expected}, got {got}")


def check_output_folder(target: str | Path, *, option: str = "--out",
                        replaceable: bool = True) -> Path:
    """The absolute path of `target` once it is known to be usable as an output folder.

    `replaceable`: the folder is replaced as a whole (`zerosim run`), so an existing one must be
    empty or hold only what zerosim writes; otherwise files are added to it. A link to a
    folder stands for the folder it names (the output lands there, the link stays).
    """
    path = Path(os.path.abspath(target))
    _check_name_lengths(path, option)
    if path.is_symlink() and path.is_dir():
        path = Path(os.path.realpath(path))
    _check_not_cwd(path, option)
    existing = _nearest_existing(path, option)
    if existing == path:
        if replaceable:
            _check_replaceable(path, option)
        _check_writable(path.parent if replaceable else path, option, path)
    else:
        _check_writable(existing, option, path)
    return path


def _check_name_lengths(path: Path, option: str) -> None:
    if len(os.fsencode(str(path))) > PATH_MAX_BYTES:
        raise OutputFolderError(option, path, f"a path of at most {PATH_MAX_BYTES} bytes",
                                f"{len(os.fsencode(str(path)))} bytes")
    for part in path.parts:
        if len(os.fsencode(part)) > FOLDER_NAME_MAX_BYTES:
            raise OutputFolderError(
                option, path, f"folder names of at most {FOLDER_NAME_MAX_BYTES}"
                " bytes (the filesystem allows 255, and zerosim writes a temporary folder "
                "beside it)", f"one of {len(os.fsencode(part))} bytes")


def _check_not_cwd(path: Path, option: str) -> None:
    cwd = Path(os.path.abspath(os.getcwd()))
    if path == cwd or path in cwd.parents:
        raise OutputFolderError(option, path, "a folder other than the current folder and its "
                                "parents (zerosim replaces the output folder whole)",
                                "the current folder" if path == cwd else "a parent of it")


def _nearest_existing(path: Path, option: str) -> Path:
    """`path` or its nearest existing parent, which must be a folder."""
    for candidate in (path, *path.parents):
        if not os.path.lexists(candidate):
            continue
        if not candidate.is_dir():
            kind = "a file" if candidate.exists() else "a broken link"
            where = "it is" if candidate == path else f"{clip(str(candidate), 120)} is"
            raise OutputFolderError(option, path, "a folder path", f"{where} {kind}, not a folder")
        return candidate
    return Path(path.anchor)


def _check_replaceable(path: Path, option: str) -> None:
    names = sorted(entry.name for entry in os.scandir(path))
    foreign = [n for n in names if not (RESULT_FILE.match(n) and (path / n).is_file())]
    if names and (foreign or MARKER_FILE not in names):
        shown = foreign[0] if foreign else names[0]
        raise OutputFolderError(option, path, "a new or empty folder, or one holding a zerosim "
                                "result (it is replaced whole)",
                                f"a folder holding {clip(shown, 60)!r}, which zerosim did "
                                "not write")


def _check_writable(folder: Path, option: str, path: Path) -> None:
    try:
        probe = fresh_folder(folder, STAGING_PREFIX)
    except OSError as err:
        raise OutputFolderError(option, path, "a folder zerosim can write in",
                                f"{clip(str(folder), 120)}: {_reason(err)}") from None
    os.rmdir(probe)


def fresh_folder(parent: Path, prefix: str) -> Path:
    """A new, empty folder in `parent` with a random name (mode from the umask, as a folder
    zerosim creates directly would have)."""
    while True:
        path = Path(parent) / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path


def _reason(err: OSError) -> str:
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if err.errno == errno.EROFS:
        return "a read-only filesystem"
    if err.errno == errno.ENOSPC:
        return "no space left"
    return err.strerror or type(err).__name__


class WriteFailedError(ZerosimError):
    """An output that could not be written whole (a full disk, a quota, permissions changed
    meanwhile): said in one line, and nothing of it is left behind."""

    def __init__(self, path: Path, err: OSError):
        super().__init__(f"{clip(str(path), 200)}: could not be written: {_reason(err)}")


@contextlib.contextmanager
def staged_folder(target: str | Path, on_published: Callable[[], object] | None = None
                  ) -> Iterator[Path]:
    """A temporary folder beside `target`; published as `target` when the block ends
    normally (then `on_published()`, before a signal held back meanwhile is let through),
    removed otherwise."""
    target = check_output_folder(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = fresh_folder(target.parent, STAGING_PREFIX)
    try:
        yield staging
        publish(staging, target, on_published)
    except OSError as err:
        raise WriteFailedError(target, err) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def atomic_write(path: Path, write: Callable[[IO[Any]], object], *, binary: bool = False
                 ) -> Path:
    """Write one file whole or not at all: `write(handle)` fills a hidden temporary beside
    `path`, which then replaces `path` in one rename; when writing fails the temporary is
    removed, `path` keeps what it held, and the error names the file."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        text_mode = {} if binary else {"encoding": "utf-8", "newline": ""}
        with open(tmp, "wb" if binary else "w", **text_mode) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise WriteFailedError(path, err) from None
    return path


def publish(staging: Path, target: Path, on_published: Callable[[], object] | None = None
            ) -> None:
    """Replace `target` (if any) by `staging` with renames that no signal interrupts;
    `on_published()` runs once `target` is the new folder, still with signals held back."""
    with deferred_interrupts():
        retired = None
        if os.path.lexists(target):
            _check_replaceable(target, "--out")
            retired = fresh_folder(target.parent, RETIRED_PREFIX)
            os.replace(target, retired)
        os.replace(staging, target)
        if on_published is not None:
            on_published()
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)


def write_text_whole(path: Path, text: str) -> Path:
    """`text` as the whole of `path`, by `atomic_write`."""
    return atomic_write(path, lambda handle: handle.write(text))


def write_table(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]
                ) -> Path:
    """A CSV of `rows` under `columns` (a value missing or None an empty cell), written whole
    by `atomic_write`, its folder made: every table a command writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda handle: write_csv(handle, columns, rows))


def table_as_read(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """The DataFrame pandas reads from the CSV `write_table` would write: a command's table
    handed to Python with the same columns and values as the file, nothing written."""
    import io

    import pandas as pd

    text = io.StringIO()
    write_csv(text, columns, rows)
    text.seek(0)
    return pd.read_csv(text)


def write_csv(handle: IO[str], columns: Sequence[str], rows: Iterable[Mapping[str, Any]]
              ) -> None:
    """`rows` under `columns` as CSV text on `handle`: what `write_table` writes to a file."""
    writer = csv.writer(handle, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(["" if row.get(c) is None else row[c] for c in columns] for row in rows)
