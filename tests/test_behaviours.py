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


@pytest.mark.parametrize(("version", "dtype", "stage", "stated", "checks"), [
    ("0.17.0", "bf16", 2, None, False),  # before PR #6976: fp16 only
    ("0.17.0", "fp16", 2, None, True),
    ("0.17.1", "bf16", 2, None, False),  # the key's default: false
    ("0.17.1", "bf16", 2, True, True),
    ("0.19.3", "bf16", 2, None, True),  # PR #8035: default true
    ("0.19.3", "bf16", 2, False, False),
    ("0.19.3", "bf16", 3, True, False),  # ZeRO-3 checks fp16 only
])
def test_which_steps_check_the_gradients_for_overflow(version, dtype, stage, stated, checks):
    overrides = {"runtime.deepspeed_version": version, "deepspeed.zero_optimization.stage": stage,
                 "deepspeed.fp16.enabled": dtype == "fp16",
                 "deepspeed.bf16.enabled": dtype == "bf16"}
    if stated is not None:
        overrides["deepspeed.bf16.check_grad_overflow"] = stated
    scenario = zerosim.load_scenario(ROOT, overrides)
    assert scenario.deepspeed.check_grad_overflow is checks
    # the optimizer on the GPU (four of them, for it to fit), where the step checks the
    # gradients itself: with it offloaded, ZeRO-1/2 check each gradient in the boundary
    # backward and the step reads the flag
    result = zerosim.simulate(ROOT, {**overrides, "model": "llama2-7b", "data_parallel": 4,
                                     "deepspeed.zero_optimization.offload_optimizer.device":
                                     "none"})
    spans = result.spans
    checked = spans[(spans.phase == "update") & (spans.op == "overflow check")]
    assert (not checked.empty) is checks


@pytest.mark.parametrize(("version", "expected"), [
    ((0, 13, 1), (False, False, "backward", "never", False)),
    ((0, 13, 3), (False, False, "backward", "never", True)),
    ((0, 14, 2), (False, False, "backward", "never", True)),
    ((0, 15, 3), (False, False, "backward", "never", False)),
    ((0, 16, 2), (True, False, "step", "never", False)),
    ((0, 18, 4), (False, True, "forward", "never", False)),
    ((0, 18, 5), (False, False, "forward", "every_hook", False)),
    ((0, 19, 5), (False, False, "forward", "per_phase", False)),
])
def test_rows_added_then_taken_out_come_to_their_window(version, expected):
    """Behaviours one release adds and a later one takes out are in effect in between only,
    as `zerosim check` prints them."""
    assert tuple(resolve_behaviours(version).in_effect().values()) == expected


def test_the_versions_page_lists_every_row_as_the_table_holds_it():
    """docs/deepspeed_versions.md holds `behaviour_markdown_rows()` after its header; after a
    change to the table, paste them in again."""
    from pathlib import Path

    from zerosim.behaviours import behaviour_markdown_rows

    page = Path(__file__).resolve().parents[1] / "docs" / "deepspeed_versions.md"
    rows = [line for line in page.read_text().splitlines() if line.startswith("| 0.")]
    assert rows == behaviour_markdown_rows()
