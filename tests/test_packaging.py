"""An install from a wheel carries what `zerosim validate` runs: the shipped scenarios go in as
data files (pyproject.toml) and the validation finds them there when no checkout sits beside
the package (`zerosim.shipped`), and an error for a scenario not found from here names the
shipped copy."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from zerosim import shipped
from zerosim.errors import ScenarioError
from zerosim.inputs import read_input_text
from zerosim.shipped import CHECKOUT, INSTALLED_DATA, shipped_root

SCENARIOS = CHECKOUT / "scenarios"


def data_files() -> dict[str, list[str]]:
    pyproject = tomllib.loads((CHECKOUT / "pyproject.toml").read_text(encoding="utf-8"))
    return pyproject["tool"]["setuptools"]["data-files"]


def test_every_shipped_scenario_file_goes_into_the_wheel_in_its_folder():
    files = data_files()
    left_out = []
    for path in sorted(p for p in SCENARIOS.rglob("*") if p.is_file()):
        relative = path.relative_to(CHECKOUT)
        target = str(INSTALLED_DATA / relative.parent)
        if not any(fnmatch(str(relative), pattern) for pattern in files.get(target, [])):
            left_out.append(str(relative))
    assert not left_out, f"not in pyproject.toml's data-files: {left_out}"


def test_the_data_files_name_no_folder_and_install_under_share_zerosim():
    for target, patterns in data_files().items():
        assert target.startswith(str(INSTALLED_DATA / "scenarios")), target
        for pattern in patterns:
            assert not [p for p in CHECKOUT.glob(pattern) if p.is_dir()], pattern


def test_a_checkout_reads_its_own_scenarios():
    assert shipped_root() == CHECKOUT


def without_a_checkout(monkeypatch, tmp_path: Path, data: Path, user_base: Path) -> None:
    """`shipped` as an install from a wheel sees it: the package in site-packages, the
    scheme's data path and the user base where given."""
    monkeypatch.setattr(shipped, "CHECKOUT", tmp_path / "lib" / "site-packages")
    monkeypatch.setattr(shipped.sysconfig, "get_path", lambda name: str(data))
    monkeypatch.setattr(shipped.site, "getuserbase", lambda: str(user_base))


def test_an_install_without_a_checkout_reads_the_copy_under_its_prefix(tmp_path, monkeypatch):
    prefix = tmp_path / "venv"
    (prefix / INSTALLED_DATA / "scenarios").mkdir(parents=True)
    without_a_checkout(monkeypatch, tmp_path, prefix, tmp_path / "user")
    assert shipped_root() == prefix / INSTALLED_DATA


def test_the_user_base_serves_a_user_install(tmp_path, monkeypatch):
    user_base = tmp_path / "user"
    (user_base / INSTALLED_DATA / "scenarios").mkdir(parents=True)
    without_a_checkout(monkeypatch, tmp_path, tmp_path / "venv", user_base)
    assert shipped_root() == user_base / INSTALLED_DATA


def test_a_scenario_not_found_from_here_names_the_shipped_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScenarioError) as shipped_one:
        read_input_text("scenarios/llama13b_dp4.yaml")
    assert "(no such file; zerosim ships one at " in str(shipped_one.value)
    assert str(shipped_one.value).endswith("scenarios/llama13b_dp4.yaml)")
    with pytest.raises(ScenarioError) as none_shipped:
        read_input_text("scenarios/no_such_scenario.yaml")
    assert str(none_shipped.value).endswith("(no such file)")
