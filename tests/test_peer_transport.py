"""A node without NVLink (`intra_node.transport`): exact timelines worked out by hand.

The toy node (`conftest.py`) with 2 GPUs: PCIe 10 GB/s per direction, no latencies, and its
ring between GPUs (`nvlink.bus_GBps`) set to 8 GB/s. An all-gather of S = 4 GB over 2 ranks
sends (N - 1)/N x S = 2 GB out of each GPU and receives as much, at the ring's 8 GB/s: 0.25 s
alone, whatever the transport. Over PCIe (peer-to-peer or SHM) those bytes leave each GPU over
its device-to-host direction and arrive over host-to-device, where the GPU's own copies run;
through host memory (SHM) each is written and read once in its GPU's NUMA domain. A ring flow
and a pinned copy weigh the same (`dma_memory_weight`), so they split a link evenly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import simpy

from tests.conftest import q, toy_profile
from zerosim.engine.machine import Machine
from zerosim.errors import ScenarioError
from zerosim.hardware.profile import load_profile, parse_profile
from zerosim.units import GiB
from zerosim.validation.validate import rtx4090_gemm_cells, shm_ring_cell
from zerosim.vocabulary import LinkKind, PeerTransport, split_resource

GATHERED = 4e9
COPY = 1e9


def profile(transport: str | None, memory_GBps: float = 1e6):
    tree = toy_profile(2)
    tree["nvlink"]["bus_GBps"] = q(8)
    tree["host"]["memory_GBps_per_domain"] = q(memory_GBps)
    if transport is not None:
        tree["intra_node"] = {"transport": q(transport)}
    return parse_profile(tree, "tests/test_peer_transport.py")


def timeline(transport: str | None, *, copy: bool = False, memory_GBps: float = 1e6
             ) -> dict[str, float]:
    """When the all-gather ends on each rank, and a pinned D2H copy of 1 GB on GPU 0 started
    beside it (`copy`)."""
    env = simpy.Environment()
    machine = Machine(env, profile(transport, memory_GBps), 2, None)
    ends: dict[str, float] = {}

    def gather(rank: int):
        yield from machine.collective(rank, ("gather",), "all_gather", GATHERED, [0, 1])
        ends[f"rank{rank}"] = env.now

    def d2h():
        yield from machine.dma(0, "d2h", COPY, pinned=True)
        ends["copy"] = env.now

    for rank in (0, 1):
        env.process(gather(rank))
    if copy:
        env.process(d2h())
    env.run()
    return ends


@pytest.mark.parametrize("transport", [None, "nvlink", "pcie_p2p", "shm"])
def test_a_ring_alone_runs_at_its_bus_bandwidth(transport):
    assert timeline(transport) == pytest.approx({"rank0": 0.25, "rank1": 0.25}, rel=1e-12)


def test_over_nvlink_a_copy_does_not_touch_the_ring():
    assert timeline("nvlink", copy=True) == pytest.approx(
        {"copy": 0.1, "rank0": 0.25, "rank1": 0.25}, rel=1e-12)


@pytest.mark.parametrize("transport", ["pcie_p2p", "shm"])
def test_over_pcie_a_copy_and_the_ring_split_the_gpus_link(transport):
    # GPU 0's device-to-host direction (10 GB/s) carries its copy and its ring's sends: 5 GB/s
    # each until the copy's 1 GB is out (0.2 s; the ring has sent 1 GB), then the ring's
    # other 1 GB at its 8 GB/s (0.125 s). The collective ends on both ranks with the last
    # flow (GPU 1's, on a free link, is done at 0.25 s).
    assert timeline(transport, copy=True) == pytest.approx(
        {"copy": 0.2, "rank0": 0.325, "rank1": 0.325}, rel=1e-12)


def test_a_ring_runs_in_step_at_its_most_loaded_link():
    # Two 1 GB copies out of GPU 0 and one of 3 GB out of GPU 1 start with the gather. GPU 0's
    # device-to-host link splits three ways (10/3 GB/s each): the ring, which moves its chunks
    # in step, runs at 10/3 on GPU 1's link too, leaving 20/3 to GPU 1's copy. At 0.3 s GPU 0's
    # copies are out (the ring has sent 1 GB, GPU 1's copy 2 GB); then GPU 1's link splits
    # evenly (5 GB/s each, under the ring's 8): the copy's last GB and the ring's by 0.5 s.
    env = simpy.Environment()
    machine = Machine(env, profile("pcie_p2p"), 2, None)
    ends: dict[str, float] = {}

    def gather(rank: int):
        yield from machine.collective(rank, ("gather",), "all_gather", GATHERED, [0, 1])
        ends[f"rank{rank}"] = env.now

    def d2h(rank: int, nbytes: float, name: str):
        yield from machine.dma(rank, "d2h", nbytes, pinned=True)
        ends[name] = env.now

    for rank in (0, 1):
        env.process(gather(rank))
    for rank, nbytes, name in ((0, COPY, "a"), (0, COPY, "b"), (1, 3 * COPY, "c")):
        env.process(d2h(rank, nbytes, name))
    env.run()
    assert ends == pytest.approx({"a": 0.3, "b": 0.3, "c": 0.5, "rank0": 0.5, "rank1": 0.5},
                                 rel=1e-12)


def test_through_host_memory_the_domain_carries_two_bytes_per_ring_byte():
    # Both GPUs hang off domain 0 (24 GB/s): each ring byte is written and read there, so
    # 2 GPUs x 2 B x rate <= 24 GB/s: 6 GB/s each, 2 GB in 1/3 s. Peer-to-peer over PCIe does
    # not touch host memory.
    assert timeline("shm", memory_GBps=24) == pytest.approx(
        {"rank0": 1 / 3, "rank1": 1 / 3}, rel=1e-12)
    assert timeline("pcie_p2p", memory_GBps=24) == pytest.approx(
        {"rank0": 0.25, "rank1": 0.25}, rel=1e-12)


@pytest.mark.parametrize(("transport", "kind"), [(None, LinkKind.NVLINK),
                                                 ("pcie_p2p", LinkKind.PEER),
                                                 ("shm", LinkKind.PEER)])
def test_the_rings_port_is_named_by_what_carries_it(transport, kind):
    machine = Machine(simpy.Environment(), profile(transport), 2, None)
    assert [split_resource(r.name)[:2] for r in machine.nvlink] == [("gpu0", kind),
                                                                    ("gpu1", kind)]


def test_the_transport_defaults_to_nvlink_with_its_reason():
    loaded = profile(None)
    assert loaded.intra_node_transport is PeerTransport.NVLINK
    prov = loaded.provenance["intra_node.transport"]
    assert (prov.basis, prov.source.startswith("default: ")) == ("assumed", True)


def test_an_unknown_transport_is_refused_naming_the_choices():
    with pytest.raises(ScenarioError) as error:
        profile("pcie")
    assert "intra_node.transport.value" in str(error.value)
    assert "one of nvlink, pcie_p2p, shm" in str(error.value)


def test_the_rtx4090_workstation_rings_through_host_memory():
    p = load_profile("rtx4090-workstation")
    assert p.intra_node_transport is PeerTransport.SHM
    assert (p.gpus_per_node, p.nvlink_Bps, p.peak_16bit_flops) == (4, 18e9, 165.2e12)
    assert (p.h2d_pinned_Bps, p.d2h_pinned_Bps) == (25.0e9, 26.5e9)
    assert p.cpu_model == "threadripper-pro-5975wx" and p.numa_domains == 1


def test_the_shm_cell_is_the_ring_rate_less_its_steps_latency():
    # A 1 GiB all-reduce over 4 GPUs: busbw = 2 x 3/4 x S / t, t = 6 steps x 10 us + the
    # 2 x 3/4 x S bytes at 18 GB/s (each GPU's 2 x 18 GB/s of ring bytes stay under its PCIe
    # links' 25 and 26.5 and its host memory's 4 x 2 x 18 = 144 of 166 GB/s).
    moved = 2 * 3 / 4 * GiB
    expected = moved / (6 * 10e-6 + moved / 18e9) / 1e9
    cell = shm_ring_cell()
    assert (cell.measured, cell.status) == (18, "reported")
    assert cell.simulated == pytest.approx(expected, rel=1e-9)


def test_the_rtx4090_gemm_rows_are_reported_at_the_fitted_rate():
    cells = rtx4090_gemm_cells()
    assert len(cells) == 8 and {c.status for c in cells} == {"reported"}
    # square products fill whole waves of 256 x 128 tiles on 128 SMs, no per-tile cost: the
    # fitted 0.964 of 165.2 TFLOPS
    assert [c.simulated for c in cells] == pytest.approx([0.964 * 165.2] * 8, rel=2e-3)


def switched(transport: str | None, gpus: int = 2, per_switch: int = 2):
    tree = toy_profile(gpus)
    tree["nvlink"]["bus_GBps"] = q(8)
    tree["pcie"]["gpus_per_switch"] = per_switch
    tree["pcie"]["switch_uplink_GBps"] = q(10)
    if transport is not None:
        tree["intra_node"] = {"transport": q(transport)}
    return parse_profile(tree, "tests/test_peer_transport.py")


def run_ends(profile_, jobs) -> dict[str, float]:
    """End of each job: ('gather', ranks, bytes) collectives and ('d2h', rank, bytes) copies,
    all started at 0."""
    env = simpy.Environment()
    machine = Machine(env, profile_, profile_.gpus_per_node, None)
    ends: dict[str, float] = {}

    def gather(rank: int, ranks: list[int], nbytes: float, name: str):
        yield from machine.collective(rank, (name,), "all_gather", nbytes, ranks)
        ends[f"{name}{rank}"] = env.now

    def d2h(rank: int, nbytes: float, name: str):
        yield from machine.dma(rank, "d2h", nbytes, pinned=True)
        ends[name] = env.now

    for name, kind, who, nbytes in jobs:
        if kind == "gather":
            for rank in who:
                env.process(gather(rank, list(who), nbytes, name))
        else:
            env.process(d2h(who, nbytes, name))
    env.run()
    return ends


def test_gpus_behind_one_switch_share_its_uplink():
    # Two GPUs behind one switch whose uplink carries 10 GB/s each way: their 1 GB copies to
    # the host share it (5 GB/s each, 0.2 s); each alone would take 0.1 s on its own link.
    jobs = [("a", "d2h", 0, COPY), ("b", "d2h", 1, COPY)]
    assert run_ends(switched(None), jobs) == pytest.approx({"a": 0.2, "b": 0.2}, rel=1e-12)
    assert run_ends(switched(None, per_switch=1), jobs) == pytest.approx(
        {"a": 0.1, "b": 0.1}, rel=1e-12)


def test_a_ring_through_host_memory_crosses_the_uplink_both_ways():
    # SHM: each GPU's 2 GB of ring bytes cross the shared uplink up and down: 2 GPUs x rate
    # <= 10 GB/s, 5 GB/s each (under the ring's 8), 0.4 s. Peer-to-peer within one switch
    # stays below it: 0.25 s at the ring's 8 GB/s.
    gather = [("g", "gather", (0, 1), GATHERED)]
    assert run_ends(switched("shm"), gather) == pytest.approx({"g0": 0.4, "g1": 0.4},
                                                               rel=1e-12)
    assert run_ends(switched("pcie_p2p"), gather) == pytest.approx({"g0": 0.25, "g1": 0.25},
                                                                    rel=1e-12)


def test_a_peer_to_peer_ring_crosses_between_switches_once_each_way():
    # Four GPUs, two per switch: a ring over all four leaves each switch once, 2 of its 4
    # steps, so each GPU's flow loads its switch's uplink with half its rate, the two GPUs of
    # a switch a whole one: an 8 GB all-gather sends 6 GB from each GPU at min(8, 10) GB/s
    # (0.75 s). A 1 GB copy out of GPU 0 beside it: the uplink's 10 GB/s split evenly with
    # the ring (one flow at rate r loading it r), 5 GB/s each until the copy ends (0.2 s,
    # the ring 1 GB in), then the ring's other 5 GB at 8 GB/s: 0.825 s.
    gather = [("g", "gather", (0, 1, 2, 3), 2 * GATHERED)]
    profile4 = switched("pcie_p2p", gpus=4)
    assert run_ends(profile4, gather) == pytest.approx(
        {f"g{r}": 0.75 for r in range(4)}, rel=1e-12)
    assert run_ends(profile4, [*gather, ("c", "d2h", 0, COPY)]) == pytest.approx(
        {"c": 0.2, **{f"g{r}": 0.825 for r in range(4)}}, rel=1e-12)


def test_more_gpus_per_switch_than_the_node_has_is_refused():
    with pytest.raises(ScenarioError, match=r"pcie\.gpus_per_switch"):
        switched(None, gpus=2, per_switch=4)


def test_check_says_how_the_gpus_reach_each_other_where_it_is_not_nvlink():
    from click.testing import CliRunner

    from zerosim.cli import main

    def check(*args: str) -> str:
        result = CliRunner().invoke(main, ["check", *args], catch_exceptions=False)
        assert result.exit_code == 0
        return " ".join(result.stdout.split())

    scenarios = Path(__file__).resolve().parents[1] / "scenarios"
    workstation = str(scenarios / "llama8b_rtx4090_workstation.yaml")
    assert ("gpu links NCCL's ring through host memory (its SHM transport) at 18 GB/s, on each "
            "GPU's PCIe link beside its copies runtime") in check(workstation)
    assert ("4 GPUs behind each PCIe switch, sharing its 25 GB/s uplink to the CPU"
            in check(workstation, "--set", "hardware.pcie.gpus_per_switch=4"))
    assert "gpu links" not in check(str(scenarios / "llama13b_dp4.yaml"))
