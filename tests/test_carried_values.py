"""A profile or stack value taken over from another shipped one says so (`carried_from`), and
the loader holds the two equal: a refit of the source cannot leave its copies behind."""

from __future__ import annotations

import copy

import pytest

from zerosim.errors import ScenarioError
from zerosim.hardware.profile import (
    builtin_profile_tree,
    load_profile,
    parse_profile,
    profile_names,
)
from zerosim.hardware.provenance import parse_provenance
from zerosim.stacks import builtin_stack_tree, load_stack, parse_stack


def _carried(name: str) -> dict[str, str]:
    return {key: prov.carried_from for key, prov in load_profile(name).provenance.items()
            if prov.carried_from is not None}


@pytest.mark.parametrize("name", profile_names())
def test_every_carried_value_of_a_shipped_profile_is_its_origins(name):
    profile = load_profile(name)
    for key, origin in _carried(name).items():
        assert profile.provenance[key].value == load_profile(origin).provenance[key].value, key


def test_the_dgx_nodes_carry_the_study_nodes_fitted_host_values():
    """The Sapphire Rapids DGX profiles take the study node's fitted oversubscription penalty
    and copy-back rate (they once kept the penalty of an earlier fit, 1.655)."""
    jlse = load_profile("h100-jlse")
    for name in ("dgx-h100", "dgx-h200"):
        carried = _carried(name)
        profile = load_profile(name)
        for key in ("cpu.oversubscription_penalty", "pcie.h2d_pageable_GBps",
                    "host.socket_link_total_GBps", "host.dma_memory_weight"):
            assert carried[key] == "h100-jlse"
            assert profile.provenance[key].value == jlse.provenance[key].value
    assert load_profile("dgx-h100").provenance["cpu.oversubscription_penalty"].value == 0.702


def _with_leaf(key: str, **changes) -> dict:
    tree = copy.deepcopy(builtin_profile_tree("dgx-h100"))
    section, leaf = key.split(".")
    tree[section][leaf] = {**tree[section][leaf], **changes}
    return tree


def test_a_carried_value_that_differs_from_its_origin_is_an_error():
    tree = _with_leaf("cpu.oversubscription_penalty", value=1.655)
    with pytest.raises(ScenarioError, match=r"my.yaml: cpu.oversubscription_penalty.value: "
                       r"expected h100-jlse's cpu.oversubscription_penalty, 0.702, .*"
                       r"got 1.655"):
        parse_profile(tree, "my.yaml")


@pytest.mark.parametrize("origin, message", [
    ("no-such-node", "another shipped profile's name"),
    ("dgx-h100", "another shipped profile's name"),
    ("h200-vm", "a shipped profile that gives host.socket_link_total_GBps"),
])
def test_a_carried_value_names_another_shipped_profile_that_gives_the_key(origin, message):
    tree = _with_leaf("host.socket_link_total_GBps", carried_from=origin)
    if origin == "h200-vm":
        assert "socket_link_total_GBps" not in builtin_profile_tree("h200-vm")["host"]
    with pytest.raises(ScenarioError, match=rf"my.yaml: host.socket_link_total_GBps."
                       rf"carried_from: expected {message}.*got '{origin}'"):
        parse_profile(tree, "my.yaml")


def test_carried_from_is_a_name_and_travels_with_the_value():
    prov = parse_provenance({"value": 0.702, "basis": "assumed", "source": "s",
                             "carried_from": "h100-jlse"}, "p.yaml", "cpu.x")
    assert prov.as_dict() == {"value": 0.702, "basis": "assumed", "source": "s",
                              "carried_from": "h100-jlse"}
    assert prov.describe_basis() == "assumed, carried from h100-jlse"
    with pytest.raises(ScenarioError, match=r"p.yaml: cpu.x.carried_from: expected the name"):
        parse_provenance({"value": 1, "basis": "assumed", "source": "s", "carried_from": 3},
                         "p.yaml", "cpu.x")


def test_a_scenario_override_replaces_a_carried_value():
    profile = load_profile("dgx-h100", {"cpu.oversubscription_penalty": 1.2})
    prov = profile.provenance["cpu.oversubscription_penalty"]
    assert (prov.value, prov.basis, prov.carried_from) == (1.2, "override", None)


def test_a_stack_carries_values_the_same_way():
    """The HF stack's launch times are Megatron-DeepSpeed's (the data cannot tell them apart):
    a refit of those moves both."""
    hf, megatron = load_stack("hf-transformers"), load_stack("megatron-deepspeed")
    for key in ("host.kernel_launch_us", "host.collective_launch_us"):
        assert hf.provenance[key].carried_from == "megatron-deepspeed"
        assert hf.provenance[key].value == megatron.provenance[key].value
    tree = copy.deepcopy(builtin_stack_tree("hf-transformers"))
    tree["host"]["collective_launch_us"]["value"] = 600
    with pytest.raises(ScenarioError, match=r"my.yaml: host.collective_launch_us.value: "
                       r"expected megatron-deepspeed's host.collective_launch_us, 529, .*"
                       r"got 600"):
        parse_stack(tree, "my.yaml")


def test_a_default_taken_from_a_shipped_profile_follows_it():
    """A profile that states no cudaMalloc rate takes h100-jlse's fitted one, read
    from its file (no copy of the number in code): polaris-a100's runs pay it."""
    polaris = load_profile("polaris-a100").provenance["gpu.cuda_malloc_GBps"]
    jlse = load_profile("h100-jlse").provenance["gpu.cuda_malloc_GBps"]
    assert "cuda_malloc_GBps" not in builtin_profile_tree("polaris-a100")["gpu"]
    assert (polaris.value, polaris.basis, polaris.carried_from) == (jlse.value, "assumed",
                                                                    "h100-jlse")
    assert jlse.basis == "fitted"


def test_a_copy_of_the_origin_under_its_name_takes_the_default_without_carrying_it():
    """A profile of one's own named like the origin (an edited copy of h100-jlse) that leaves
    the cudaMalloc rate out takes the shipped value, not a carry from itself."""
    tree = copy.deepcopy(builtin_profile_tree("h100-jlse"))
    del tree["gpu"]["cuda_malloc_GBps"]
    prov = parse_profile(tree, "mine.yaml").provenance["gpu.cuda_malloc_GBps"]
    assert (prov.value, prov.carried_from) == (
        load_profile("h100-jlse").provenance["gpu.cuda_malloc_GBps"].value, None)
