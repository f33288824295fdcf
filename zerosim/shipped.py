"""Where zerosim's shipped scenarios (`scenarios/`) are: in the checkout beside the package, or,
installed from a wheel, where the install scheme puts data (pyproject.toml's
`tool.setuptools.data-files`). Standard library only, so every layer may ask."""

from __future__ import annotations

import site
import sysconfig
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
"""The checkout's root (in an install from a wheel, the site-packages folder: no scenarios)."""
INSTALLED_DATA = Path("share") / "zerosim"
"""Where an install from a wheel puts the shipped `scenarios/`, under the scheme's data path."""


def shipped_root() -> Path:
    """The folder whose `scenarios/` holds the shipped scenarios: the checkout's root, or,
    installed from a wheel, the copy where the install scheme puts data (the environment's
    prefix; /usr/local for a system pip on Debian), or under the user base (`pip install
    --user`)."""
    for root in (CHECKOUT, Path(sysconfig.get_path("data")) / INSTALLED_DATA,
                 Path(site.getuserbase()) / INSTALLED_DATA):
        if (root / "scenarios").is_dir():
            return root
    return CHECKOUT


def shipped_copy(path: Path) -> Path | None:
    """The shipped file that the relative `path` names from the folder holding `scenarios/`
    (`scenarios/llama13b_dp4.yaml`), for an error where `path` is not found from here; None
    for an absolute path or one zerosim does not ship."""
    if path.is_absolute():
        return None
    copy = shipped_root() / path
    return copy if copy.is_file() else None
