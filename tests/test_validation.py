"""Regression against published measurements, through `zerosim run`'s code path.

Two testbeds: the study's H100 node (Table 2 and its observations) and the 41 Polaris runs on
an A100 node. One profile per testbed and one software stack for both, their values fitted by
`zerosim calibrate` on both data sets together (scenarios/calibration/README.md); no per-cell,
per-DP or per-phase factor anywhere. The cells zerosim misses are listed below with the reason,
and a test keeps that list exact: a new miss fails it, and so does a listed miss that passes.
"""

from pathlib import Path

import pytest
import yaml

from zerosim.validation.polaris import MEASURED_PHASES, case_name, configurations
from zerosim.validation.reference import PHASES, load_study
from zerosim.validation.validate import ALTERNATIVES_GROUP, NVME_GROUP, POLARIS_GROUP, judge

ROOT = Path(__file__).resolve().parent.parent

GA2_OUTLIER = (
    "this run sits above its model's other runs: the GA=1 runs' mean backward (11.78 s over "
    "three repeats spanning 10.2-14.1 s) plus one non-boundary micro-batch as the GA=4, 8 and "
    "16 runs give it (3.1-3.7 s) makes about 15.2 s against its 16.89 s, and the model's 14.0 s "
    "is 8% under that, 2.3 standard deviations of one run as the table's repeats scatter; it "
    "passed (-14.0%, -8.8%) while Polaris's page zeroing was held at an "
    "earlier model's 5.03 GB/s, which the current fit (5.19, 2%) replaces")
VM_GROUP = "DeepSpeed 0.19.5 ZeRO-3 offload on one H200 (a real run)"
VM_HOST_PATH = (
    "the two 128-token runs time DeepSpeed's hooks and PyTorch's dispatch alone (GPU work a "
    "few ms); with the parameters on the host the real forward took 0.142 s and the backward "
    "0.157 s, against 0.195 and 0.178 s with them in HBM (both at DP=1, where 0.19.5 fetches "
    "with `_no_gather_coalesced` either way, its `.to(device)` a copy from pinned memory or "
    "a no-op), so the host's path per module was about 0.3 ms shorter with the parameters "
    "offloaded, which nothing in the code read explains; zerosim prices one hook time for "
    "both, fitted on the run with them in HBM, and adds the H2D copies the fetches wait for")
LLMQ_GROUP = "LLaMA-Factory's ZeRO offload on RTX 4090s (IST-DASLab/llmq)"
LLMQ_RING = (
    "the workstation's four cards ran each micro-batch 1.2-1.9x as long per sequence as its "
    "one card did (the single-card runs come out -9.0% to +3.5%); at the profile's ring "
    "through host memory (18 GB/s, NCCL on another four-4090 box) ZeRO-3's gathers and "
    "reduce-scatters hide behind the GPUs' work, and a ring of about 2 GB/s (nccl-tests on "
    "four 4090s in a container gave 2.6 GB/s, kalavai-client) puts the three runs at -12%, "
    "-8% and 0% (tests/test_llmq_runs.py); the box's ring is not stated")
KNOWN_MISSES = {
    **{(LLMQ_GROUP, f"qwen2.5-{size}, 4x RTX 4090, ZeRO-3, {batch}", "step time (second step)"):
       f"{error}: {LLMQ_RING}" for size, batch, error in (("3b", "64x2", "-16.1%"),
                                                         ("7b", "32x4", "-31.1%"),
                                                         ("14b", "21x6", "-47.0%"))},
    **{(VM_GROUP, "tinyllama_hooks_param", f"{phase} (median of 8 iterations)"):
       f"{error}: {VM_HOST_PATH}" for phase, error in (("forward", "+45.9%"),
                                                      ("backward", "+21.4%"))},
    **{(POLARIS_GROUP, "polaris-11.20b-dp1-mb4-ga2-sg1e08 (x1)", f"{phase} per step"):
       f"{error}: {GA2_OUTLIER}" for phase, error in (("backward", "-16.9%"),
                                                     ("iteration", "-10.7%"))},
    (POLARIS_GROUP, "polaris-11.20b-dp1-mb1-ga1-sg1e08 (x1)", "forward per step"): (
        "-15.3%: measured on a slower GPU: this run and the next three rows (the 11.20B "
        "micro-batch-4 runs at DP=1, 2 and 4) ran their forwards 16.1-16.9% slower than later "
        "repeats of the same configurations and their backwards 6-8% slower, their CPU "
        "updates alike; at the SM clock fitted on those three forwards' ratios (0.827, "
        "polaris_sessions.yaml) the model gives this forward -2.0% (group 'Polaris runs on a "
        "slower GPU'); judged here at the plain profile, as a user would run it"),
    ("Table 2", "DP=1", "backward_boundary"): (
        "+5.8%: the model's boundary flush is per-rank work (each gradient partition's pageable "
        "16-bit D2H, the kernel zeroing its fresh pages, the cast on the CPU), so it falls x0.50 "
        "from DP=1 to DP=2 (11.85 to 5.98 s), where no pool oversubscribes the CPU and one rank "
        "copies across the sockets; the measured one falls x0.55 (11.2 to 6.13 s), as if part of "
        "it did not shrink with DP; the study node's page zeroing, fitted on all three boundary "
        "backwards with the Polaris runs, sits between the two cells (DP=2 -2.4%); were every "
        "flush temporary on this node fresh (no heap reuse at DP=2 and 4), the three come out "
        "+2.2%, -0.1% and -2.4% at 3.15 GB/s (h100-jlse's alternative fresh_flush_pages, "
        "reported in its own group), but Polaris's runs want the reuse "
        "(scenarios/calibration/README.md)"),
    ("GPU kernels (H100)", "GEMM 8192x5120x13824", "PyTorch BF16 throughput"): (
        "+8.8% (5% for a product of K >= 4096 and more): PyTorch runs the 5120-wide block's "
        "micro-batch-4 down projection 5.7% below its micro-batch-1 one (716 against 760 "
        "TFLOPS), where the model, with four times the tiles, puts it 6.9% above: a kernel "
        "choice one efficiency and one tile cost do not follow"),
    **{("collectives", "HGX H100 (XLA), 8 GPUs", f"{kind} busbw, {size:g} GiB"): reason
       for kind, sizes, reason in (
           ("all_gather", (0.25, 0.5), "+5.3% and +6.9%: the ring at dgx-h100's nccl-tests "
            "rate (367 GB/s) against XLA's all-gathers, which approach it more slowly"),
           ("reduce_scatter", (0.25, 0.5, 1, 2), "+11% to +13%: the engine's reduce-scatter "
            "is a ring at the all-gather's rate; XLA's reach about 337 GB/s where nccl-tests "
            "on the same board give about 370 for reduce-scatters and all-gathers alike "
            "(NVIDIA/nccl-tests#212): XLA's NCCL set-up as much as the board (a reduce-scatter "
            "through NVLink SHARP, where each GPU sends the switch its whole buffer, takes 8/7 "
            "of the ring's time on 8 GPUs, NVIDIA/nccl#1083: 321 GB/s, what XLA's 1 and 2 GiB "
            "rows give, 322 and 329; which algorithm XLA's NCCL ran is not recorded)"),
           ("all_reduce", (0.25, 0.5, 1, 2), "-7% to -10%: NCCL all-reduces faster than a "
            "ring on an H100 NVSwitch (NVLink SHARP), which the engine does not model; XLA's "
            "reach about 407 GB/s, between the ring's 370 and nccl-tests' 480 with SHARP "
            "(NVIDIA/nccl#2140), so a SHARP model from nccl-tests would miss them too"))
       for size in sizes},
}


def known(key: tuple[str, str, str]):
    """A parameter that is expected to miss, with its reason (strict: passing fails)."""
    if key in KNOWN_MISSES:
        return pytest.param(*key[1:], marks=pytest.mark.xfail(strict=True,
                                                              reason=KNOWN_MISSES[key]))
    return pytest.param(*key[1:])


@pytest.fixture(scope="module")
def cells(validation_cells):
    return {(c.group, c.case, c.quantity): c for c in validation_cells}


@pytest.mark.parametrize(("case", "phase"), [known(("Table 2", f"DP={dp}", phase))
                                             for dp in (1, 2, 4) for phase in PHASES])
def test_table2_phase_within_5_percent(cells, case, phase):
    cell = cells[("Table 2", case, phase)]
    assert abs(cell.rel_error) <= 0.05, f"{case} {phase}: {cell.simulated:.3f} s vs {cell.measured}"


@pytest.mark.parametrize(("case", "phase"), [(f"DP={dp}", phase)
                                             for dp in (1, 2, 4) for phase in PHASES])
def test_table2_phase_within_10_percent(cells, case, phase):
    """The bar the model met before issue 11 asked for 5%: what a miss above may not exceed."""
    cell = cells[("Table 2", case, phase)]
    assert abs(cell.rel_error) <= 0.10, f"{case} {phase}: {cell.simulated:.3f} s vs {cell.measured}"


def test_each_alternative_reading_of_the_study_node_is_reported_on_table2_within_10_percent(
        cells):
    """What the study node's alternatives claim: Table 2 cannot tell them from the values
    shipped. Each is reported on the twelve phases, and each phase stays within the 10% bar
    the shipped values meet."""
    found = [c for key, c in cells.items() if key[0] == ALTERNATIVES_GROUP]
    assert sorted({c.case.split(", ")[1] for c in found}) == [
        "fresh_flush_pages", "power_capped_clock", "stream_host_memory"]
    assert len(found) == 36 and {c.status for c in found} == {"reported"}
    assert max(abs(c.rel_error) for c in found) <= 0.10


def _polaris_keys() -> list[tuple[str, str, str]]:
    keys = []
    for configuration in configurations():
        case = f"{case_name(configuration.first)} (x{len(configuration.runs)})"
        keys += [(POLARIS_GROUP, case, f"{phase} per step") for phase in MEASURED_PHASES]
        keys.append((POLARIS_GROUP, case, "rank 0 peak allocated GPU memory"))
    return keys


@pytest.mark.parametrize(("case", "quantity"), [known(key) for key in _polaris_keys()])
def test_polaris_cell_within_its_tolerance(cells, case, quantity):
    """Each phase per step within 15%, the iteration within 10%, rank 0's peak allocated GPU
    memory within 10% (issue 11's bar), repeated runs averaged."""
    cell = cells[(POLARIS_GROUP, case, quantity)]
    assert cell.status == "pass", f"{case} {quantity}: {cell.simulated:.3f} vs {cell.measured:.3f}"


def _nvme_keys() -> list[tuple[str, str, str]]:
    from zerosim.validation.mlp_offload import load_runs

    quantities = [f"{phase} per step" for phase in MEASURED_PHASES]
    memory = ["rank 0 peak allocated GPU memory", "rank 0 peak allocated GPU memory in the forward",
              *(f"rank 0 allocated GPU memory after the {phase}"
                for phase in ("forward", "backward", "update"))]
    return [(NVME_GROUP, run.name, quantity) for run in load_runs()
            for quantity in (*quantities, *memory)]


@pytest.mark.parametrize(("case", "quantity"), [known(key) for key in _nvme_keys()])
def test_h100_nvme_cell_within_its_tolerance(cells, case, quantity):
    """The MLP-Offload baselines on the study's node, optimizer on NVMe: the Polaris runs'
    bars. Their backwards and steps fit the drives' two rates; the rest are predictions,
    among them what rank 0 holds when each phase ends, which the prefetcher's live bound
    sets at the end of the forward."""
    cell = cells[(NVME_GROUP, case, quantity)]
    assert cell.status == "pass", f"{case} {quantity}: {cell.simulated:.3f} vs {cell.measured:.3f}"


def test_each_polaris_configurations_gap_between_the_phases_is_reported(cells):
    """Every configuration's iteration less its three phases, per step, its runs' mean beside
    zerosim's loop and memory reports: reported, not judged (the collector's time per object
    and the per-step loop are fitted on these gaps)."""
    from zerosim.runs import BETWEEN_PHASES

    for configuration in configurations():
        case = f"{case_name(configuration.first)} (x{len(configuration.runs)})"
        cell = cells[(POLARIS_GROUP, case, "between the phases, per step")]
        assert cell.status == "reported"
        assert cell.measured == configuration.measured(BETWEEN_PHASES) > 0


def test_the_polaris_gap_grows_with_the_ranks_beyond_the_model():
    """What zerosim leaves out between the phases on Polaris (README, multi-node): unbound, at
    micro-batch 4, the runs' gap less zerosim's grows from DP=1 by 0.04-0.08 s at DP=2 and
    0.12-0.18 s at DP=4, as if each rank past the first added about 0.05 s a step."""
    from zerosim.validation.loop_gap import data_parallel_growth, polaris_gaps

    growth = data_parallel_growth(polaris_gaps())
    assert sorted(growth) == [1, 2, 4] and growth[1] == 0
    assert 0.04 < growth[2] < 0.08 and 0.12 < growth[4] < 0.18


@pytest.mark.parametrize(("case", "layers"), [("44.28b", 64), ("48.16b", 128),
                                              ("68.61b", 80), ("105.89b", 124)])
def test_the_h100_nodes_loop_between_the_phases_is_reported_beside_zerosims(cells, case,
                                                                            layers):
    """What Megatron's loop spends outside DeepSpeed's timers on the study's node, 0.46-0.57 s a
    step: reported, not judged, beside the stack's loop (0.63 ms a micro-batch, 71 ms a step)
    and DeepSpeed's six memory reports (memory_breakdown on in these logs), each a gc.collect()
    of 421,000 objects and 252 per parameter tensor (six a layer: the fused QKV, the output
    projection, the fused gate-up, the down projection, two norms; and three more) at 152 ns,
    all at the stack's 3.0 GHz, run at the node's 3.8 GHz."""
    from zerosim.validation.mlp_offload import load_runs

    run, = (r for r in load_runs() if r.name.startswith(f"mlp-offload-{case}-"))
    cell = cells[(NVME_GROUP, run.name, "between the phases, per step")]
    assert cell.status == "reported" and cell.measured == run.between_phases_s
    report = 152e-9 * (421_000 + 252 * (6 * layers + 3))
    assert cell.simulated == pytest.approx((0.00063 + 0.071 + 6 * report) * 3.0 / 3.8,
                                           rel=1e-9)


@pytest.mark.parametrize(("case", "layers"), [("44.28b", 64), ("48.16b", 128),
                                              ("68.61b", 80), ("105.89b", 124)])
def test_one_memory_report_on_the_h100_node_within_15_percent(cells, case, layers):
    """One of DeepSpeed's memory reports as the MLP-Offload logs time it (59-72 ms: the
    backward's start marker to "Engine before backward"), judged: the same collection as the
    test above, 152 ns x (421,000 + 252 x (6 x layers + 3)) objects at 3.0 over 3.8 GHz,
    nothing fitted on this node."""
    from zerosim.validation.mlp_offload import load_runs

    run, = (r for r in load_runs() if r.name.startswith(f"mlp-offload-{case}-"))
    cell = cells[(NVME_GROUP, run.name, "one memory report (rank 0's collection)")]
    assert cell.measured == run.memory_report_s
    assert cell.simulated == pytest.approx(152e-9 * (421_000 + 252 * (6 * layers + 3))
                                           * 3.0 / 3.8, rel=1e-9)
    assert cell.status == "pass"


def test_the_loop_fit_prices_the_gap_as_the_engine_does(cells):
    """`python -m zerosim.validation.loop_gap`'s out-of-sample figures are the engine's."""
    from zerosim.validation.loop_gap import one_report_out_of_sample, out_of_sample

    for name, measured, predicted in out_of_sample():
        cell = cells[(NVME_GROUP, name, "between the phases, per step")]
        assert cell.measured == measured
        assert cell.simulated == pytest.approx(predicted, rel=1e-9)
    for name, measured, predicted in one_report_out_of_sample():
        cell = cells[(NVME_GROUP, name, "one memory report (rank 0's collection)")]
        assert (cell.measured, cell.simulated) == (measured, predicted)


@pytest.mark.parametrize("case", ["DP=1", "DP=2"])
def test_tflops_within_10_percent(cells, case):
    assert abs(cells[("Table 2", case, "TFLOPS per GPU")].rel_error) <= 0.10


def test_dp4_tflops_is_excluded_as_inconsistent_with_its_own_row(cells):
    cell = cells[("Table 2", "DP=4", "TFLOPS per GPU")]
    assert cell.status == "excluded" and "inconsistent" in cell.note
    # The study's own formula on its own phase times gives about 43; zerosim lands near it.
    assert cell.simulated == pytest.approx(43, rel=0.10)


@pytest.mark.parametrize("quantity", ["GPU memory at forward start",
                                      "activations of one micro-batch",
                                      "GPU memory during the update"])
def test_memory_observations_within_10_percent(cells, quantity):
    assert abs(cells[("memory", "DP=1", quantity)].rel_error) <= 0.10


def test_update_equal_at_dp2_and_dp4(cells):
    assert abs(cells[("observations", "DP=2,4", "update DP=4 / update DP=2")].rel_error) <= 0.10


def test_the_studys_adam_figure_is_neither_row_of_the_update(cells):
    """The study's "DeepSpeedCPUAdam at 4.5e9 params/s" is its pageable H2D peak (9 GB/s)
    over the copy-back's 2 B a parameter; with the fp16 overflow check priced at its measured
    rate, zerosim's DP=1 update runs that row at its fitted 11.7 GB/s (5.85e9 a second) and
    the CPU row in the rest of the 4.6 s."""
    row = cells[("observations", "DP=1", "update's H2D row, against the study's 4.5e9")]
    assert row.status == "reported" and row.measured == 4.5e9
    assert row.simulated == pytest.approx(11.7e9 / 2, rel=0.01)
    adam = cells[("observations", "DP=1", "CPU Adam throughput")]
    assert adam.status == "excluded" and "overflow check" in adam.note


def test_the_studys_flush_d2h_rate_lies_between_zerosims_two_readings(cells):
    """The study's 8 GB/s during the DP=1 boundary flush: zerosim's DMA alone runs at the
    pageable peak, each copy with its fresh temporary's page zeroing far below it."""
    dma = cells[("observations", "DP=1", "boundary flush D2H throughput")]
    with_faults = cells[("observations", "DP=1",
                         "boundary flush D2H throughput, each copy's page zeroing inside it")]
    assert dma.status == with_faults.status == "reported"
    assert with_faults.simulated < dma.measured == 8.0 < dma.simulated
    assert dma.simulated == pytest.approx(16.0, rel=0.01)


def test_boundary_backward_share_of_the_dp1_iteration(cells):
    cell = cells[("observations", "DP=1", "boundary backward share of the iteration")]
    assert abs(cell.rel_error) <= 0.10


@pytest.mark.parametrize("size", ["7B", "13B", "30B", "70B", "130B", "175B"])
def test_table1_columns_within_8_percent(cells, size):
    """Through `zerosim estimate`'s code path; the 8% and its reason are in study.yaml."""
    (case,) = {c for g, c, _ in cells if g == "Table 1" and c.startswith(f"{size} ")}
    for quantity in ("model states", "optimizer states"):
        cell = cells[("Table 1", case, quantity)]
        assert cell.status == "pass" and abs(cell.rel_error) <= 0.08, (size, quantity)


def test_deepspeed_estimator_tables_to_the_printed_hundredth(cells):
    """Every GB DeepSpeed's docs print for t5-3b: 6 rows x 2 for ZeRO-3, 2 x 2 for ZeRO-2."""
    estimator = [c for c in cells.values() if c.group == "DeepSpeed estimator"]
    assert len(estimator) == 16
    assert all(c.absolute and c.tolerance == 0.005 for c in estimator)
    assert all(f"{c.simulated:.2f}" == f"{c.measured:.2f}" for c in estimator)
    assert {c.status for c in estimator} == {"pass"}


@pytest.mark.parametrize(("simulated", "status"), [(71.694, "pass"), (71.686, "pass"),
                                                   (71.70, "fail"), (71.68, "fail")])
def test_absolute_tolerance_is_half_the_printed_digit(simulated, status):
    cell = judge("DeepSpeed estimator", "t", "per CPU", "GB", 71.69, simulated, 0.005,
                 absolute=True)
    assert cell.status == status


def test_the_judged_cells_that_miss_are_exactly_the_known_misses(cells):
    statuses = {c.status for c in cells.values()}
    assert statuses <= {"pass", "fail", "excluded", "reported"}
    failing = {key for key, c in cells.items() if c.status == "fail"}
    assert failing == set(KNOWN_MISSES)
    judged = [c for c in cells.values() if c.status in ("pass", "fail")]
    assert len(judged) == 470


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_study_scenario_files_match_the_reference_setup(dp):
    """scenarios/llama13b_dp*.yaml are the validated cases as files: keep them identical."""
    study = load_study().scenario_for(dp)
    on_disk = yaml.safe_load((ROOT / "scenarios" / f"llama13b_dp{dp}.yaml").read_text())
    on_disk["deepspeed"]["zero_optimization"]["reduce_bucket_size"] = float(
        on_disk["deepspeed"]["zero_optimization"]["reduce_bucket_size"])
    study["deepspeed"]["zero_optimization"]["reduce_bucket_size"] = float(
        study["deepspeed"]["zero_optimization"]["reduce_bucket_size"])
    for key in ("model", "sequence_length", "activation_checkpointing", "attention",
                "hardware", "data_parallel", "deepspeed", "runtime"):
        assert on_disk[key] == study[key], key


def test_pcie_drop_probe_is_the_dma_share_of_a_saturated_numa_domain(cells):
    """The section 3.5 probe on h100-jlse: unscale (memory-bound, 8 B/element) and a pinned H2D
    share one domain of 307 GB/s in proportion to their weights, 1 (per byte) and
    dma_memory_weight w = 0.08768: the copy gets 307 w / (1 + w) = 24.75 GB/s of its 55. The
    probe times a 4 GiB transfer, each after the profile's 10 us PCIe latency."""
    w, size, latency = 0.08768, 4 * 2**30, 10e-6
    alone = latency + size / 55e9
    shared = latency + size / (307e9 * w / (1 + w))
    expected = 1 - alone / shared
    cell = cells[("observations", "probe", "PCIe drop while unscale runs")]
    assert cell.simulated == pytest.approx(expected, rel=1e-9)
    assert cell.status == "pass"


@pytest.mark.parametrize("billions", [1, 2, 4, 8])
def test_superoffload_adam_steps_replay_the_scalar_loop_and_host_memory(cells, billions):
    """A lone DeepSpeedCPUAdam on gh200: 72 threads of the scalar loop, 3.1 GHz / 21.7 cycles
    each, under what host memory allows (353 GB/s over 28 B per element = 1.26e10/s); with no
    OpenMP pool besides its own, its tile regions lose nothing. GraceAdam's cell is the same
    kernel with the compute ceiling lifted: the memory rate alone."""
    from zerosim.validation.validate import CPU_ADAM_GROUP

    n, compute, memory = billions * 1e9, 72 * 3.1e9 / 21.7, 353e9 / 28
    assert compute < memory
    case = f"{billions}B parameters"
    adam = cells[(CPU_ADAM_GROUP, case, "DeepSpeedCPUAdam step")]
    assert adam.simulated == pytest.approx(n / compute, rel=1e-9)
    assert adam.status == "pass"
    grace = cells[(CPU_ADAM_GROUP, case,
                   "GraceAdam (SVE) step, against Adam at host memory's rate")]
    assert grace.simulated == pytest.approx(n / memory, rel=1e-9)
    assert grace.status == "reported" and abs(grace.rel_error) < 0.05


def test_a_case_that_did_not_fit_prints_oom_not_a_number():
    from dataclasses import replace

    from zerosim.validation.validate import judge

    cell = replace(judge("g", "case", "TFLOPS per GPU", "TFLOPS", 89.0, 0.0, None,
                         excluded="does not fit in zerosim (out of HBM)"), simulated_text="oom")
    assert cell.shown("0.00") == ("oom", "")
    assert judge("g", "c", "q", "s", 2.0, 2.5, 0.5).shown("2.50") == ("2.50", "+25.0%")


def test_the_report_has_every_cell_and_the_count_the_cells_give(cells, tmp_path):
    """`zerosim validate`'s files: the markdown table, the CSV (one row per cell), the study's
    plot and the Polaris runs' predicted-against-measured plot."""
    import csv

    from zerosim.scenario import scenario_from_dict
    from zerosim.validation.report import polaris_points, write_report

    study = load_study()
    profile = scenario_from_dict(study.scenario_for(1), source="study").hardware
    found = list(cells.values())
    readme, table, image, polaris = write_report(found, study, profile, tmp_path)
    text = readme.read_text()
    judged = [c for c in found if c.status in ("pass", "fail")]
    passed = sum(c.status == "pass" for c in judged)
    assert f"Judged cells: {passed} of {len(judged)} within tolerance." in text
    assert "PyTorch's BF16 GEMMs of the replayed transformers on an H100 SXM" in text
    # the group's 110 cells and its line in the summary table (64 judged, 63 passing, 46 reported)
    assert sum(line.startswith("| GPU kernels (H100) |") for line in text.splitlines()) == 111
    assert "| GPU kernels (H100) | 64 | 63 | 46 |" in text
    with table.open() as f:
        assert len(list(csv.DictReader(f))) == len(found)
    assert image.stat().st_size > 0 and polaris.name == "polaris.png"
    assert len(polaris_points(found)) == 29 * 4


def test_the_committed_report_is_what_validate_gives_on_its_workers(cells, tmp_path):
    """The session's cells (the groups of runs on the sweep's process pool, one worker per
    CPU) written as `zerosim validate` writes them are the committed results/validation's CSV
    row for row (that report was written at `--workers 1`, and with seed 003's rows, which the
    session leaves out): every text cell the same, every number within 1e-9 of it (the last
    bit of a libm function may differ from one machine to another). So the workers change
    nothing, and the committed report is the current model's: after a model change, run
    `zerosim validate` and commit what it writes."""
    import csv
    import math

    from zerosim.scenario import scenario_from_dict
    from zerosim.validation.report import write_report
    from zerosim.validation.validate import SEED003_GROUP

    study = load_study()
    profile = scenario_from_dict(study.scenario_for(1), source="study").hardware
    _, table, _, _ = write_report(list(cells.values()), study, profile, tmp_path)
    with table.open() as f:
        written = list(csv.DictReader(f))
    with (ROOT / "results" / "validation" / "validation.csv").open() as f:
        committed = list(csv.DictReader(f))
    assert sum(row["group"] == SEED003_GROUP for row in committed) == 6
    committed = [row for row in committed if row["group"] != SEED003_GROUP]
    assert len(written) == len(committed)
    numbers = ("measured", "simulated", "tolerance", "rel_error")
    for new, old in zip(written, committed, strict=True):
        key = (old["group"], old["case"], old["quantity"])
        assert {k: v for k, v in new.items() if k not in numbers} == {
            k: v for k, v in old.items() if k not in numbers}, key
        for column in numbers:
            if old[column] == "" or new[column] == "":
                assert new[column] == old[column], (key, column)
            else:
                assert math.isclose(float(new[column]), float(old[column]), rel_tol=1e-9,
                                    abs_tol=1e-12), (key, column, new[column], old[column])


def test_the_report_says_what_the_study_runs_phases_wait_on():
    """`zerosim validate` hands the study's results to the report, which tabulates each phase's
    three largest waits: the DP=1 forward waits on the host thread (the emptied CUDA cache's
    `cudaMalloc`, then ZeRO-3's hooks), its boundary backward on the flush's page zeroing."""
    from zerosim.validation.report import critical_path_lines
    from zerosim.validation.validate import run_study

    lines = critical_path_lines({1: run_study(load_study(), 1)})
    assert "## What the study's phases wait on in the model" in lines
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| ")}
    assert rows["| forward"].startswith("| forward | cuda_malloc ")
    assert ", hooks " in rows["| forward"]
    assert rows["| backward boundary"].startswith("| backward boundary | zero_pages ")
    assert critical_path_lines({}) == []


def test_the_accumulation_series_are_reported_as_predict_splits_them(cells):
    """The Polaris runs' two accumulation series, each time split into what each micro-batch
    adds and what the step adds once: reported (not judged, the runs are the cells above), with
    the values `zerosim.series` gives on the same predictions."""
    series = {key: c for key, c in cells.items()
              if key[0] == POLARIS_GROUP and ": what " in key[2]}
    assert {c.status for c in series.values()} == {"reported"}
    assert sorted({key[1] for key in series}) == [
        "polaris-11.20b-dp1-mb4-ga1..16-sg1e08 (7 runs)",
        "polaris-5.90b-dp1-mb4-ga1..16-sg1e08 (8 runs)"]
    assert len(series) == 16
    forward = series[(POLARIS_GROUP, "polaris-5.90b-dp1-mb4-ga1..16-sg1e08 (8 runs)",
                      "forward: what the step adds once")]
    loop = series[(POLARIS_GROUP, "polaris-5.90b-dp1-mb4-ga1..16-sg1e08 (8 runs)",
                   "between phases: what each micro-batch adds")]
    assert loop.measured == pytest.approx(0.241, abs=5e-4)
    assert forward.simulated == 0.0 and forward.measured == pytest.approx(0.0308, abs=5e-5)
    backward = series[(POLARIS_GROUP, "polaris-11.20b-dp1-mb4-ga1..16-sg1e08 (7 runs)",
                       "backward: what each micro-batch adds")]
    assert backward.measured == pytest.approx(3.3287, abs=5e-5)


def test_the_report_sums_each_group_up():
    """Two judged cells of group A (+10% passing at 15%, -20% failing), one reported; one
    absolute cell of group B: A's rms is sqrt((0.01 + 0.04) / 2), its largest -20%; B has no
    relative error to sum."""
    from zerosim.validation.report import GroupSummary, group_summaries, summary_table

    cells = [judge("A", "x", "t", "s", 1.0, 1.1, 0.15), judge("A", "y", "t", "s", 1.0, 0.8, 0.15),
             judge("A", "z", "t", "s", 1.0, 3.0, None),
             judge("B", "w", "m", "GB", 2.0, 2.004, 0.005, absolute=True)]
    a, b = group_summaries(cells)
    assert (a.group, a.judged, a.passed, a.reported) == ("A", 2, 1, 1)
    assert a.rms == pytest.approx(((0.1 ** 2 + 0.2 ** 2) / 2) ** 0.5, rel=1e-9)
    assert a.largest == pytest.approx(-0.2, rel=1e-9)
    assert b == GroupSummary("B", 1, 1, 0, None, None)
    assert summary_table(cells)[2:] == ["| A | 2 | 1 | 1 | 15.8% | -20.0% |",
                                        "| B | 1 | 1 | 0 |  |  |"]
