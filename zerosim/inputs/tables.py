"""CSV tables a user gives (measured runs, calibration measurements): a header, then rows of
exactly as many fields.

`csv.DictReader` fills a short row's missing fields with None, files a long row's extra ones
under no name and lets a column named twice take its last value: a field shifted by a missing
or extra separator, a quoted row or a table saved with another separator would be read as
something else, or crash the reader later. Here each of those is a `ScenarioError` naming the
table and the row.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

from zerosim.errors import Described, ScenarioError

NEWLINE_IN_FIELD = "new-line character seen in unquoted field"
"""The csv module's complaint about a carriage return inside a line (lines split at line
feeds only, so that is the one new-line character it can meet unquoted)."""


def read_table(text: str, source: str, *, delimiter: str = ",", label: str = "row",
               first: int = 1) -> tuple[list[str], Iterator[dict[str, str]]]:
    """The header's column names (stripped) and each row's fields by column, blank lines
    skipped. The rows are read as they are iterated, so that the caller's checks of the header
    come first and a row's problems come in row order. Rows are named `label` and numbered
    from `first` (`row 1` for the first data row; `line 2` where the header is line 1)."""
    lines = csv.reader(io.StringIO(text), delimiter=delimiter)
    header = [name.strip() for name in _next_line(lines, source, "<header>", delimiter) or ()]
    _check_header(source, header)
    return header, _rows(lines, header, source, delimiter, label, first)


def _rows(lines: Iterator[list[str]], header: list[str], source: str, delimiter: str,
          label: str, first: int) -> Iterator[dict[str, str]]:
    number = first
    while (cells := _next_line(lines, source, f"{label} {number}", delimiter)) is not None:
        if not cells:
            continue
        if len(cells) != len(header):
            raise ScenarioError(source, f"{label} {number}", f"{_fields(len(header))} "
                                f"separated by {delimiter!r}, one per column of the header",
                                Described(_fields(len(cells))))
        yield dict(zip(header, cells, strict=True))
        number += 1


def _fields(count: int) -> str:
    return f"{count} field" + ("" if count == 1 else "s")


def _next_line(lines: Iterator[list[str]], source: str, place: str, delimiter: str
               ) -> list[str] | None:
    """The next line's fields, None after the last; a line the csv module cannot split is an
    error at `place`."""
    try:
        return next(lines, None)
    except csv.Error as err:
        reason = str(err).partition(" - ")[0]
        raise ScenarioError(source, place, f"fields separated by {delimiter!r}, a line break "
                            "only inside a quoted field",
                            Described("a carriage return inside an unquoted field"
                                      if reason == NEWLINE_IN_FIELD else reason)) from None


def _check_header(source: str, header: list[str]) -> None:
    """Each named column once: a second one would silently take the first one's place."""
    for index, name in enumerate(header):
        if name and name in header[:index]:
            raise ScenarioError(source, "<header>", "each column once",
                                Described(f"{name!r} as columns {header.index(name) + 1} "
                                          f"and {index + 1}"))
