"""The table of DeepSpeed behaviours: one row per field, switching exactly at its release."""

from __future__ import annotations

from dataclasses import fields

import pytest

import zerosim
from zerosim.behaviours import (
    BEHAVIOURS,
    FORK_OPTIONS,
    Behaviours,
    behaviour_table,
    resolve_behaviours,
)

ROOT = "scenarios/llama13b_dp1.yaml"


def test_every_row_is_a_field_and_every_field_a_row():
    assert (sorted([row.name for row in BEHAVIOURS] + list(FORK_OPTIONS))
            == sorted(f.name for f in fields(Behaviours)))
    assert all(row.source and row.what for row in BEHAVIOURS)


@pytest.mark.parametrize("row", BEHAVIOURS, ids=lambda row: row.name)
def test_a_behaviour_starts_exactly_at_its_release(row):
    major, minor, patch = row.since
    before = (major, minor, patch - 1) if patch else (major, minor - 1, 99)
    assert getattr(resolve_behaviours(row.since), row.name) is True
    assert getattr(resolve_behaviours(before), row.name) is False


def test_the_scenario_carries_its_release_behaviours_and_check_prints_them():
    scenario = zerosim.load_scenario(ROOT, ["runtime.deepspeed_version=0.19.5"])
    assert scenario.behaviours == resolve_behaviours((0, 19, 5))
    assert scenario.to_dict()["deepspeed_behaviours"]["boundary_flush_non_blocking"] is True
    assert scenario.deepspeed.offload_optimizer.pin_memory is True  # the 0.19.5 default
    assert {r["since"] for r in behaviour_table()} >= {"0.15.4", "0.19.5", "0.6.0"}
