"""Figures: what each one shows, read back from its artists; the CLI that draws them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from matplotlib.figure import Figure

import zerosim
from zerosim import plots
from zerosim.cli import main
from zerosim.results import load_result
from zerosim.units import GB, GiB, figure_text

ROOT = Path(__file__).resolve().parent.parent
DP1 = ROOT / "scenarios" / "llama13b_dp1.yaml"
PHASES = ("forward", "backward_non_boundary", "backward_boundary", "update")


@pytest.fixture(scope="module")
def dp1() -> zerosim.Result:
    return zerosim.simulate(DP1)


@pytest.fixture(scope="module")
def oom() -> zerosim.Result:
    result = zerosim.simulate(DP1, overrides={"hardware.gpu.hbm_GiB": 30})
    assert result.status == "oom"
    return result


@pytest.fixture(scope="module")
def two_ranks() -> zerosim.Result:
    return zerosim.simulate(ROOT / "scenarios" / "llama13b_dp2.yaml")


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def by_gid(fig: Figure, gid: str):
    found = [a for ax in fig.axes for a in ax.get_children() if a.get_gid() == gid]
    assert found, f"no artist with gid {gid!r}"
    return found[0]


def level_at(memory: pd.DataFrame, device: str, t_s: float) -> float:
    """Bytes in use at t_s, straight from the records: the last level of each category."""
    rows = memory[(memory.device == device) & (memory.t_s <= t_s)]
    return float(rows.groupby("category").bytes.last().sum())


# --------------------------------------------------------------------------- timeline

def test_timeline_has_a_row_per_stream_and_named_phases(dp1):
    fig = plots.timeline(dp1)
    assert isinstance(fig, Figure)
    main_ax = fig.axes[-1]
    assert main_ax.get_xlabel() == "time (s)"
    assert "llama2-13b-dp1" in fig.axes[0].get_title()
    rows = [t.get_text() for t in main_ax.get_yticklabels()]
    assert rows == ["host thread", "compute", "reduce", "PCIe H2D", "PCIe D2H",
                    "CPU"]  # no all-gather at DP=1
    assert {"fwd 0", "bwd 0", "fwd 1", "bwd 1 (boundary)", "update"} <= set(texts(fig))
    bars = sum(len(c.get_paths()) for c in main_ax.collections)
    assert bars == len(dp1.spans)


def test_timeline_selects_ranks_and_a_time_window(two_ranks):
    fig = plots.timeline(two_ranks)
    rows = [t.get_text() for t in fig.axes[-1].get_yticklabels()]
    assert rows[0] == "rank 0  host thread" and any(r.startswith("rank 1") for r in rows)
    assert "rank 0  all-gather" in rows
    end = float(two_ranks.phases.end_s.max())
    fig = plots.timeline(two_ranks, ranks=[1], t_range=(0.0, end / 2))
    rows = [t.get_text() for t in fig.axes[-1].get_yticklabels()]
    assert rows and all("rank" not in r for r in rows)
    assert fig.axes[-1].get_xlim() == pytest.approx((0.0, end / 2))
    assert "(ranks 1 of 2)" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="no rank 5 in this run; ranks: 0, 1"):
        plots.timeline(two_ranks, ranks=[5])


# --------------------------------------------------------------------------- memory

def test_memory_stack_top_is_the_sum_of_category_levels(dp1):
    fig = plots.memory_over_time(dp1, "gpu0")
    ax = fig.axes[-1]
    assert ax.get_ylabel() == "memory (GiB)" and ax.get_xlabel() == "time (s)"
    assert "gpu0" in fig.axes[0].get_title() and "llama2-13b-dp1" in fig.axes[0].get_title()
    total = by_gid(fig, "memory-total")
    assert total.get_drawstyle() == "steps-post"
    xs, ys = np.asarray(total.get_xdata()), np.asarray(total.get_ydata())
    boundary = dp1.phases.query("phase == 'backward'").iloc[-1]
    for t in (0.0, float(dp1.phases.end_s.iloc[0]), (boundary.start_s + boundary.end_s) / 2,
              float(dp1.phases.end_s.max()) - 1e-9):
        shown = ys[np.searchsorted(xs, t, side="right") - 1]
        assert shown == pytest.approx(level_at(dp1.memory, "gpu0", t) / GiB, rel=1e-12)
        assert plots.memory_total_at(dp1.memory, "gpu0", t) == pytest.approx(
            level_at(dp1.memory, "gpu0", t), rel=1e-12)
    # the stacked areas reach exactly the total: the top layer's upper edge is its peak
    top_layer = next(c for c in ax.collections if c.get_label().startswith("workspace"))
    assert top_layer.get_paths()[0].vertices[:, 1].max() == pytest.approx(ys.max())
    assert ys.max() == pytest.approx(dp1.summary["peak_hbm_GiB"])
    capacity = by_gid(fig, "memory-capacity")
    assert capacity.get_ydata()[0] == pytest.approx(dp1.capacities["gpu0"] / GiB)


def test_memory_categories_are_stacked_bottom_up_with_fixed_colours(dp1):
    stack = plots.memory_stack(dp1.memory, "gpu0")
    assert list(stack.columns[:3]) == ["runtime context", "framework buffers", "params 16-bit"]
    fig = plots.memory_over_time(dp1, "gpu0")
    legend = {t.get_text().split(" (peak")[0]: h for t, h in
              zip(fig.axes[-1].get_legend().get_texts(),
                  fig.axes[-1].get_legend().legend_handles, strict=True)}
    assert tuple(legend["activations"].get_facecolor()[:3]) == pytest.approx(
        tuple(int(plots.MEMORY_COLORS["activations"][i:i + 2], 16) / 255 for i in (1, 3, 5)))
    assert plots.memory_color("fp32 grads (pinned)") == plots.MEMORY_COLORS["fp32 grads"]
    assert plots.memory_color("something new") == plots.memory_color("something new")


def test_host_memory_plot(dp1):
    fig = plots.memory_over_time(dp1, "host0")
    assert "host0" in fig.axes[0].get_title()
    ys = by_gid(fig, "memory-total").get_ydata()
    assert max(ys) == pytest.approx(dp1.summary["peak_host_GiB"])
    with pytest.raises(ValueError, match="no memory records for device 'gpu7'"):
        plots.memory_over_time(dp1, "gpu7")


def test_oom_is_marked_where_it_happened(oom):
    info = oom.summary["oom"]
    fig = plots.memory_over_time(oom, "gpu0")
    marker = by_gid(fig, "oom-marker")
    assert marker.get_xdata()[0] == pytest.approx(info["t_s"])
    assert marker.get_ydata()[0] == pytest.approx(info["in_use_GiB"] + info["requested_GiB"])
    assert marker.get_ydata()[0] > by_gid(fig, "memory-capacity").get_ydata()[0]
    assert "out of memory" in fig.axes[-1].get_title()
    assert any(info["allocation"] in t for t in texts(fig))
    assert by_gid(plots.timeline(oom), "oom-marker") is not None
    host = plots.memory_over_time(oom, "host0")  # the OOM was not on the host
    assert not [a for ax in host.axes for a in ax.get_children() if a.get_gid() == "oom-marker"]


def test_save_all_draws_where_each_phase_goes_for_the_phases_that_ran(tmp_path, oom):
    """A run that ran out of memory before its first phase ended has no phase to break down:
    its figures are the others."""
    written = {p.name for p in plots.save_all(oom, tmp_path, formats=("png",))}
    assert written == {"timeline.png", "memory_gpu0.png", "memory_host0.png", "pcie_gpu0.png",
                       "phases.png"}


def test_a_run_out_of_memory_at_its_first_allocation_draws_without_a_warning(tmp_path):
    """It ends where it starts: every time axis is given a microsecond, not equal limits
    (which matplotlib warns about)."""
    import warnings

    result = zerosim.simulate(DP1, overrides={
        "deepspeed.zero_optimization.offload_optimizer.device": "none"})
    assert result.status == "oom" and result.summary["oom"]["t_s"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = plots.save_all(result, tmp_path, formats=("png",))
    assert {p.name for p in written} >= {"timeline.png", "memory_gpu0.png", "pcie_gpu0.png"}
    assert plots.timeline(result).axes[0].get_xlim() == (0.0, 1e-6)


# --------------------------------------------------------------------------- PCIe, phases

def test_pcie_throughput_moves_the_summary_bytes(dp1):
    fig = plots.pcie_throughput(dp1, gpu=0)
    h2d, d2h = fig.axes[-2:]
    assert h2d.get_ylabel() == "PCIe H2D (GB/s)" and d2h.get_ylabel() == "PCIe D2H (GB/s)"
    assert d2h.get_xlabel() == "time (s)"
    for ax, direction in ((h2d, "h2d"), (d2h, "d2h")):
        mean = next(ln for ln in ax.get_lines() if ln.get_label().startswith("mean over"))
        x, y = np.asarray(mean.get_xdata()), np.asarray(mean.get_ydata())
        moved = float(np.sum(y[:-1] * np.diff(x)))
        assert moved == pytest.approx(dp1.summary["pcie_GB"][direction], rel=1e-6)
        assert max(y) <= 55.0 + 1e-6  # never above the pinned link rate


def test_phase_breakdown_bars_are_the_summary_and_the_measurements(dp1):
    measured = {"DP=1": {"forward": 0.31, "backward_non_boundary": 1.03,
                         "backward_boundary": 11.2, "update": 4.6}}
    fig = plots.phase_breakdown({"DP=1": dp1.summary}, measured=measured)
    panels = [ax for ax in fig.axes if ax.patches]
    assert [ax.get_title().replace("\n", " ") for ax in panels] == [
        "forward", "backward (non-boundary)", "backward (boundary)", "optimizer update"]
    assert panels[0].get_ylabel() == "time (s)"
    for ax, phase in zip(panels, PHASES, strict=True):
        heights = [p.get_height() for p in ax.patches]
        assert heights == pytest.approx([dp1.summary["phases_s"][phase],
                                         measured["DP=1"][phase]])
    single = plots.phase_breakdown(dp1.summary)
    assert "llama2-13b-dp1" in single._suptitle.get_text()


def test_phase_breakdown_of_an_oom_run_says_out_of_memory(oom, dp1):
    fig = plots.phase_breakdown(oom.summary)
    assert texts(fig) == ["OOM"] * 4
    assert fig._suptitle.get_text() == "llama2-13b-dp1: out of memory: no phase finished"
    failure = oom.summary["oom"]
    assert [t.get_text() for t in fig.texts if t is not fig._suptitle] == [
        f"out of memory on {failure['device']} at {failure['t_s']:.4g} s:\n"
        f"{failure['allocation']} needs {failure['requested_GiB']:.2f} GiB "
        f"({failure['category']})\nwith {failure['in_use_GiB']:.2f} GiB in use of "
        f"{failure['capacity_GiB']:.2f} GiB"]
    beside = plots.phase_breakdown({"fits": dp1.summary, "oom": oom.summary})
    assert texts(beside)[1::2] == ["OOM"] * 4
    assert "out of memory" not in beside._suptitle.get_text()


def test_timeline_folds_identical_ranks_past_eight(toy):
    result = toy.run({"data_parallel": 12, "hardware": {"gpu": {"numa_domain": [0] * 12}}},
                     gpus=12)
    assert [len(g) for g in plots.identical_rank_groups(result.spans, list(range(12)))] == [12]
    fig = plots.timeline(result)
    labels = [t.get_text() for t in fig.axes[-1].get_yticklabels()]
    assert labels and all(label.startswith("ranks 0-11 (x12)  ") for label in labels)
    assert "(12 ranks, identical ones folded)" in texts_of_titles(fig)
    unfolded = plots.timeline(result, ranks=range(12))
    assert len(unfolded.axes[-1].get_yticklabels()) == 12 * len(labels)


def texts_of_titles(fig) -> str:
    return " ".join([fig._suptitle.get_text() if fig._suptitle else ""]
                    + [ax.get_title() for ax in fig.axes])


def test_activity_explains_the_boundary_backward(dp1):
    table = plots.activity(dp1, phase="backward")
    assert {"stream", "kind", "spans", "busy_s", "share"} <= set(table.columns)
    assert set(table.kind) >= {"zero_pages", "grad_flush (pageable)", "grad_to_host (pinned)",
                               "cast", "partition_grads", "backward"}
    assert plots.span_kind("", "", "an op of an older folder") == "an op of an older folder"
    phase = dp1.phases.query("phase == 'backward'").iloc[-1]
    assert table.busy_s.max() <= phase.end_s - phase.start_s + 1e-9
    links = plots.link_activity(dp1, phase="backward")
    assert set(links.resource) >= {"gpu0.pcie.d2h", "host0.numa0.memory"}
    d2h = links.set_index("resource").loc["gpu0.pcie.d2h"]
    flushed = dp1.spans.query("stream == 'pcie.d2h' and micro_batch == 1").bytes.sum() / GB
    assert d2h.amount == pytest.approx(flushed, rel=1e-6)
    fig = plots.phase_activity(dp1)
    assert "bwd 1 (boundary)" in fig.axes[0].get_title()


def test_the_critical_path_chart_has_a_bar_per_phase_split_by_what_it_waited_on(dp1):
    """One bar per phase time, its pieces the phase's shares (adding up to the whole bar),
    the boundary backward's largest piece named (the study's page zeroing at DP=1), and the
    host thread's `cudaMalloc`, what the forward waits on most, among the kinds named."""
    fig = plots.critical_path_chart(dp1)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "forward", "backward (non-boundary)", "backward (boundary)", "optimizer update"]
    widths: dict[float, float] = {}
    for bar in ax.patches:
        widths[round(bar.get_y(), 6)] = widths.get(round(bar.get_y(), 6), 0.0) + bar.get_width()
    assert len(widths) == 4 and all(w == pytest.approx(1.0) for w in widths.values())
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "zero_pages" in texts
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(text.startswith("cuda_malloc (") for text in legend)
    assert "critical path of rank 0" in ax.get_title()
    assert "other ranks" not in ax.get_xlabel()   # one rank: nothing to go through


def test_the_critical_path_chart_says_how_long_the_path_ran_on_other_ranks():
    """The study's DP=4 rank 0 waits for rank 1 in its reduce-scatters: the line under the
    axis gives the path's seconds on rank 1, as `results.critical.rank_path` counts them."""
    from zerosim.results.critical import rank_path

    result = zerosim.simulate("scenarios/llama13b_dp4.yaml")
    seconds = rank_path(result.critical_path, 0).through[1]
    label = plots.critical_path_chart(result).axes[0].get_xlabel()
    assert label.endswith(f"where the rank waited for them: rank 1 {seconds:.3g} s")


# --------------------------------------------------------------------------- sweeps

@pytest.fixture()
def sweep_frame() -> pd.DataFrame:
    rows = []
    for version, slow in (("0.13.3", 2.0), ("0.17.0", 1.0)):
        for bucket in (1e8, 2e8, 5e8, 1e9):
            rows.append({"scenario": "s", "deepspeed_version": version,
                         "reduce_bucket_size": bucket, "status": "ok",
                         "iteration_s": slow * (10 + bucket / 1e9),
                         "phases_s.update": slow, "peak_hbm_GiB": 30 + bucket / 1e9})
    rows.append({"scenario": "s", "deepspeed_version": "0.13.3", "reduce_bucket_size": 3e9,
                 "status": "oom", "iteration_s": None, "phases_s.update": None,
                 "peak_hbm_GiB": 79.0})
    return pd.DataFrame(rows)


def test_sweep_metric_draws_one_line_per_hue(sweep_frame):
    fig = plots.sweep_metric(sweep_frame, "reduce_bucket_size", "iteration_s",
                             hue="deepspeed_version")
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("deepspeed_version")]
    assert [ln.get_label() for ln in lines] == ["deepspeed_version = 0.13.3",
                                                "deepspeed_version = 0.17.0"]
    assert list(lines[1].get_ydata()) == pytest.approx([10.1, 10.2, 10.5, 11.0])
    assert ax.get_xlabel() == "reduce_bucket_size" and ax.get_ylabel() == "iteration_s (s)"
    assert ax.get_title() == "s: iteration_s vs reduce_bucket_size"
    assert [ln for ln in ax.get_lines() if ln.get_label() == "out of memory"]
    fig = plots.sweep_metric(sweep_frame, "deepspeed_version", "phases_s.update")
    assert fig.axes[0].get_ylabel() == "phases_s.update (s)"
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0.13.3", "0.17.0"]
    with pytest.raises(KeyError, match="nope"):
        plots.sweep_metric(sweep_frame, "nope", "iteration_s")


def test_sweep_heatmap_cells_hold_the_metric(sweep_frame):
    fig = plots.sweep_heatmap(sweep_frame, x="reduce_bucket_size", y="deepspeed_version",
                              metric="peak_hbm_GiB")
    ax = fig.axes[0]
    image = ax.get_images()[0].get_array()
    assert image.shape == (2, 5)
    assert image[1, 0] == pytest.approx(30.1) and image[0, 4] == pytest.approx(79.0)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["100M", "200M", "500M", "1G", "3G"]
    assert ax.get_ylabel() == "deepspeed_version"
    assert fig.axes[1].get_ylabel() == "peak_hbm_GiB (GiB)"
    oom_cells = plots.sweep_heatmap(sweep_frame, "reduce_bucket_size", "deepspeed_version",
                                    "iteration_s")
    assert "OOM" in texts(oom_cells)
    assert [figure_text(v, 3) for v in (7365.4, 1202.0, 999.6, 38.67, 0.0123)] == [
        "7,365", "1,202", "1,000", "38.7", "0.0123"]
    assert [figure_text(v, 4) for v in (16682.3, 9999.6, 2014.2, -12345.0)] == [
        "16,682", "10,000", "2014", "-12,345"]


# --------------------------------------------------------------------------- files, CLI

def test_no_figure_leaks_into_pyplot(dp1):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    plots.memory_over_time(dp1)
    plots.phase_breakdown(dp1.summary)
    assert plt.get_fignums() == before


def test_run_with_plots_writes_png_and_svg_and_plot_redraws_them(tmp_path, dp1):
    out = tmp_path / "dp1"
    result = CliRunner().invoke(main, ["run", str(DP1), "--out", str(out), "--plots"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    figures = {"timeline", "memory_gpu0", "memory_host0", "pcie_gpu0", "phases",
               "critical_path", "activity_forward", "activity_backward", "activity_update"}
    names = {p.name for p in out.iterdir()}
    assert {f"{f}.{ext}" for f in figures for ext in ("png", "svg")} <= names
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "timeline.svg").read_text().lstrip().startswith("<?xml")
    assert json.loads((out / "capacities.json").read_text())["gpu0"] > 0

    loaded = load_result(out)
    fresh = dp1
    assert loaded.summary == json.loads(json.dumps(fresh.summary))
    assert loaded.capacities == fresh.capacities
    pd.testing.assert_frame_equal(loaded.memory, fresh.memory, check_dtype=False)
    pd.testing.assert_frame_equal(loaded.phases, fresh.phases, check_dtype=False)

    again = tmp_path / "again"
    redraw = CliRunner().invoke(main, ["plot", str(out), "--out", str(again), "--format", "png"],
                                catch_exceptions=False)
    assert redraw.exit_code == 0, redraw.output
    assert {p.name for p in again.iterdir()} == {f"{f}.png" for f in figures}
    assert str(again / "timeline.png") in redraw.output


def test_plot_of_a_folder_without_results_fails_clearly(tmp_path):
    result = CliRunner().invoke(main, ["plot", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a zerosim result folder, missing summary.json" in result.output


def test_plots_need_files():
    result = CliRunner().invoke(main, ["run", str(DP1), "--no-files", "--plots"])
    assert result.exit_code == 2
    assert "--plots and --compact-trace write files" in result.output


def test_load_result_without_capacities_json_uses_the_summary(tmp_path, dp1):
    from zerosim.results.export import write_outputs

    write_outputs(dp1, tmp_path)
    (tmp_path / "capacities.json").unlink()
    loaded = load_result(tmp_path)
    assert loaded.capacities["gpu0"] == pytest.approx(dp1.capacities["gpu0"], abs=1)
    assert loaded.capacities["host0"] == pytest.approx(dp1.capacities["host0"], abs=1)


@pytest.mark.parametrize("command", [
    ["run", str(DP1)], ["sensitivity", str(DP1)],
    ["predict", str(ROOT / "zerosim" / "validation" / "data" / "polaris_zero3_offload_runs.csv"),
     "--hardware", "polaris-a100"]])
def test_an_out_folder_needs_files_too(tmp_path, command):
    """--out beside --no-files would be ignored, so it is refused as --plots is."""
    result = CliRunner().invoke(main, [*command, "--no-files", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert result.output.endswith("Error: --out writes files; drop --no-files\n")
    assert not (tmp_path / "o").exists()
