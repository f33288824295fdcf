"""Terminal rendering with rich: tables for scenarios and results."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from zerosim.errors import clip
from zerosim.hardware.costs import CpuPools
from zerosim.hardware.placement import Shares, everywhere, place_ranks
from zerosim.hardware.profile import HardwareProfile
from zerosim.hardware.provenance import basis_text
from zerosim.results.compare import DERIVED_SETTINGS
from zerosim.results.critical import RankPath, through_text, waits_text
from zerosim.results.summary import (
    PEAK_ERROR_FRACTION,
    capacity_that_fits,
    last_to_finish,
    oom_text,
    phase_time,
    tight_memory,
)
from zerosim.runs import BETWEEN_PHASES as BETWEEN_PHASES_QUANTITY
from zerosim.runs import MEMORY_QUANTITIES, PEAK_ALLOCATED, PEAK_HOST
from zerosim.scenario import Scenario
from zerosim.units import GB, MS, GiB, figure_text, ordered_sum
from zerosim.vocabulary import JUDGED, PCIE_STREAMS, PeerTransport, PhaseTime, Status, Verdict


def _console(min_width: int = 100) -> Console:
    return Console(soft_wrap=False, width=max(Console().width, min_width))


def _mode(scenario: Scenario) -> str:
    """'ZeRO-3, optimizer on nvme, params on cpu' (or 'optimizer on gpu, params on cpu';
    'no offload') in a few words."""
    ds = scenario.deepspeed
    optimizer = (ds.offload_optimizer.device if ds.offload_optimizer.enabled else "gpu")
    if not ds.offload_optimizer.enabled and not ds.offload_param.enabled:
        where = ["no offload"]
    else:
        where = [f"optimizer on {optimizer}"]
    if ds.offload_param.enabled:
        where.append(f"params on {ds.offload_param.device}")
    if ds.zenflow is not None:
        overlap = ", its CPU step overlapped" if ds.zenflow.overlap_step else ""
        where.append(f"ZenFlow (top {ds.zenflow.topk_ratio:g} of the gradient columns on the "
                     f"GPU, the rest every {ds.gradient_accumulation_steps} steps{overlap})")
    if ds.offload_optimizer.super_offload:
        when = ("as the backward completes them" if not ds.gradient_clipping
                else "in the step (gradient_clipping set: nothing stepped early)")
        where.append(f"SuperOffload (sub-groups stepped by an optimizer process {when})")
    if ds.low_precision_master:
        where.append(f"{ds.master_dtype} master params and gradients, "
                     f"{ds.optimizer_state_dtype} Adam moments")
    if ds.stage == 3 and (zero_plus_plus := _zero_plus_plus_text(scenario)):
        where.append(zero_plus_plus)
    if ds.mics.acts(ds.stage):
        where.append(_mics_text(scenario))
    if not ds.managed_accumulation:
        where.append("unmanaged gradient accumulation (step() is the boundary)")
    if ds.sequence_parallel_size > 1:
        size = ds.sequence_parallel_size
        where.append(f"Ulysses sequence parallelism (groups of {size} ranks, each holding "
                     f"1/{size} of every sequence; gradients reduced in "
                     f"{ds.communication_dtype})")
    if tiling := _tiling_text(scenario):
        where.append(tiling)
    if scenario.runtime.liger_kernel:
        rows = liger_loss_rows(scenario)
        where.append(f"Liger-Kernel (Triton RMSNorm, rotary embedding and SwiGLU; the logits "
                     f"and loss fused, over {len(rows)} chunks of {rows[0]} tokens)")
    return f"ZeRO-{ds.stage}, " + ", ".join(where)


def liger_loss_rows(scenario: Scenario) -> tuple[int, ...]:
    """The chunks of a rank's tokens Liger-Kernel's fused linear cross entropy runs."""
    from zerosim.engine.plan import workload_of
    from zerosim.models.breakdown import fused_loss_rows

    model = scenario.model
    return fused_loss_rows(workload_of(scenario).tokens, model.vocab_size,
                           model.embedding_width)


def _tiling_text(scenario: Scenario) -> str:
    """Arctic Long Sequence Training's tiled calls in a few words ('' without)."""
    from zerosim.engine.plan import workload_of

    w = workload_of(scenario)
    parts = []
    if w.tiled_mlp_shards:
        agreed = ", the count agreed by a sync before each" if w.tiled_mlp_agreed else ""
        parts.append(f"each MLP over {w.tiled_mlp_shards} slices{agreed}")
    if w.tiled_loss_shards:
        parts.append(f"the logits and loss over {w.tiled_loss_shards} slices")
    return "tiled (" + "; ".join(parts) + ")" if parts else ""


def _mics_text(scenario: Scenario) -> str:
    """MiCS's shard groups in a few words."""
    ds = scenario.deepspeed
    replicas = ds.mics.replicas(ds.stage, scenario.data_parallel)
    across = (f", gradients all-reduced across the {replicas} groups at the boundary"
              if replicas > 1 else "")
    gather = (", all-gathers across its nodes, then within each" if ds.mics.hierarchical
              else "")
    return f"MiCS (partitioned over groups of {ds.mics.shard_size} ranks{across}{gather})"


def _zero_plus_plus_text(scenario: Scenario) -> str:
    """hpZ, qwZ and qgZ in a few words ('' without any, or on one rank; qgZ only where it
    acts, across nodes)."""
    settings = scenario.deepspeed.zero_plus_plus
    if scenario.data_parallel == 1:
        return ""
    parts = []
    if (group := settings.hpz_group(scenario.data_parallel)) > 1:
        from zerosim.engine.plan import hpz_secondary_bytes

        where = ("in host memory" if scenario.deepspeed.offload_param.device == "cpu"
                 else "in HBM")
        parts.append(f"hpZ (secondary partitions over groups of {group} ranks, {where}, "
                     f"{hpz_secondary_bytes(scenario) / 2**30:.1f} GiB a rank from the first "
                     "forward to the step)")
    if settings.quantized_weights:
        parts.append("qwZ (int8 all-gathers of the parameters)")
    if settings.quantizes_gradients(scenario.deepspeed.stage, scenario.data_parallel,
                                    scenario.hardware.gpus_per_node):
        loco = ""
        if settings.loco is not None:
            from zerosim.engine.plan import loco_error_feedback_bytes

            kept = loco_error_feedback_bytes(scenario) / 2**30
            loco = f", with LoCo's error feedback, {kept:.1f} GiB a rank kept between steps"
        parts.append("qgZ (int4 all-to-all reductions of the gradients, within then across "
                     f"nodes{loco})")
    return "ZeRO++ " + " and ".join(parts) if parts else ""


def _leaves_text(scenario: Scenario) -> str:
    """The ZeRO-3 leaves, grouped by name pattern: 'model.layers.*.self_attn (22)'."""
    from zerosim.engine.plan import leaves_of

    names = leaves_of(scenario).names
    if not names:
        return ""
    counts: dict[str, int] = {}
    for name in names:
        pattern = re.sub(r"\.\d+(?=\.|$)", ".*", name) or "the whole model"
        counts[pattern] = counts.get(pattern, 0) + 1
    return (", ".join(f"{pattern} ({count})" for pattern, count in counts.items())
            + ": each fetched whole by one hook, no module inside it hooked")


def _experts_text(model) -> str:
    moe = model.moe
    if moe is None:
        return ""
    shared = (f" + a shared expert of {moe.shared_expert_intermediate_size}"
              if moe.shared_expert_intermediate_size else "")
    return (f", {moe.num_experts} experts of {moe.expert_intermediate_size} (top "
            f"{moe.num_experts_per_tok}) in {len(moe.layers)} layers{shared}")


def render_scenario(scenario: Scenario) -> None:
    console = _console()
    m, ds, hw = scenario.model, scenario.deepspeed, scenario.hardware
    console.print(f"[bold]{scenario.name}[/bold]  ({scenario.source})  valid")
    top = Table(show_header=False, box=None, pad_edge=False)
    top.add_row("model", f"{m.name}: {m.model_type or m.family}, h={m.hidden_size}, "
                f"L={m.num_hidden_layers}, ffn={m.intermediate_size}, "
                f"heads={m.num_attention_heads}/{m.num_key_value_heads} kv, vocab={m.vocab_size}"
                + (f", activation {m.activation}" if m.activation else "")
                + (", q/k norms" if m.qk_norm else "") + _experts_text(m))
    documents = (f" packing documents of {scenario.document_length} tokens (each attends "
                 "within itself)" if scenario.document_length is not None else "")
    top.add_row("workload", f"seq {scenario.sequence_length}{documents}, micro-batch "
                f"{ds.train_micro_batch_size_per_gpu}, grad accumulation "
                f"{ds.gradient_accumulation_steps}, attention {scenario.attention}, "
                f"activation checkpointing {scenario.activation_checkpointing}")
    top.add_row("hardware", f"{hw.label}: {hw.nodes} node(s) x {hw.gpus_per_node} "
                f"{hw.gpu_name}; data_parallel {scenario.data_parallel}")
    if others := [a.name for a in hw.alternatives if a.name != hw.alternative]:
        top.add_row("readings", f"{', '.join(others)}: the profile's alternatives, other "
                    "readings of its data (hardware.alternative=NAME runs one; zerosim "
                    "sensitivity, each)")
    if links := _gpu_links_text(hw):
        top.add_row("gpu links", links)
    top.add_row("runtime", f"DeepSpeed {scenario.runtime.version_text}, "
                f"cpu_threads_per_rank {_threads_text(scenario)}")
    top.add_row("cpu pools", _pools_text(scenario.cpu_pools()))
    if (threads := scenario.zenflow_worker_threads()) is not None:
        top.add_row("zenflow", f"the optimizer process of each rank on {threads} threads "
                    f"(pt_reserved_cores_perc {ds.zenflow.pt_reserved_cores_perc:g})")
    if (threads := scenario.superoffload_worker_threads()) is not None:
        top.add_row("superoffload", f"the optimizer process of each rank on {threads} threads "
                    f"(cpuadam_cores_perc {ds.offload_optimizer.cpuadam_cores_perc:g})")
    if scenario.deepspeed.offload_optimizer.enabled:
        top.add_row("cpu adam", _adam_text(scenario))
    if reports := _reports_text(scenario):
        top.add_row("breakdown", reports)
    if scenario.hardware.numa_domains > 1:
        top.add_row("numa", _placement_text(scenario))
    top.add_row("framework", f"{scenario.stack.name}: " + ", ".join(
        f"{key} {value}" for key, value in scenario.stack.layout().items()))
    top.add_row("mode", _mode(scenario))
    if leaves := _leaves_text(scenario):
        top.add_row("leaves", leaves)
    behaviours = scenario.behaviours.describe()
    top.add_row("behaviours", ", ".join(f"{name} {_yes_no(on)}"
                                        for name, on in behaviours.items()))
    top.add_row("in effect", ", ".join(f"{name} {_yes_no(value)}" for name, value
                                       in scenario.behaviours.in_effect().items()))
    console.print(top)
    table = Table(title="deepspeed (resolved, defaults filled in)", title_justify="left")
    table.add_column("key")
    table.add_column("value")
    for key, value in _flatten(ds.to_dict()):
        table.add_row(key, str(value))
    console.print(table)
    if scenario.auto_filled:
        auto = Table(title="'auto' values (filled as the Hugging Face Trainer fills them)",
                     title_justify="left")
        for column in ("key", "value", "from"):
            auto.add_column(column, overflow="fold")
        for fill in scenario.auto_filled:
            auto.add_row(f"deepspeed.{fill.key}", str(fill.value), fill.origin)
        console.print(auto)
    prov = Table(title=f"hardware profile {hw.name}", title_justify="left")
    for column in ("key", "value", "basis", "source"):
        prov.add_column(column, overflow="fold")
    for key, p in hw.provenance.items():
        prov.add_row(key, str(p.value), p.describe_basis(), p.source)
    console.print(prov)
    if scenario.unmodelled_keys:
        console.print("[yellow]not modelled (ignored):[/yellow] "
                      + ", ".join(scenario.unmodelled_keys))


def _flatten(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


PHASE_ROWS = {PhaseTime.FORWARD: "forward",
              PhaseTime.BACKWARD_NON_BOUNDARY: "backward (non-boundary)",
              PhaseTime.BACKWARD_BOUNDARY: "backward (boundary)",
              PhaseTime.UPDATE: "optimizer update"}
BETWEEN_PHASES = "between phases"
MEMORY_REPORTS = "  of which memory reports"
"""DeepSpeed's memory reports with `memory_breakdown` (`summary["memory_reports_s"]`)."""


def iteration_totals(phases, accumulation_steps: int) -> tuple[int | None, dict[str, float],
                                                                dict[str, int]]:
    """Seconds each phase takes over the whole iteration on the rank that finishes last, and
    how many times it runs; with the time between phases the rows add up to its end.
    `phases`: `Result.phases`, or the phase records of a summary-only run (`Brief.phases`)."""
    rows = _phase_rows(phases)
    rank = last_to_finish(rows)
    if rank is None:
        return None, {}, {}
    end = max(end_s for row_rank, _, _, _, end_s in rows if row_rank == rank)
    last = accumulation_steps - 1
    totals = {key.value: 0.0 for key in PhaseTime}
    counts = {key.value: 0 for key in PhaseTime}
    for row_rank, phase, micro, start_s, end_s in rows:
        key = phase_time(phase, micro, last)
        if row_rank == rank and key is not None:
            totals[key.value] += end_s - start_s
            counts[key.value] += 1
    totals[BETWEEN_PHASES] = end - ordered_sum(totals.values())
    return rank, totals, counts


def _phase_rows(phases) -> list[tuple]:
    """(rank, phase, micro_batch, start_s, end_s) rows of a phases DataFrame or Table."""
    if phases is None:
        return []
    if hasattr(phases, "itertuples"):
        columns = ["rank", "phase", "micro_batch", "start_s", "end_s"]
        return list(phases[columns].itertuples(index=False, name=None))
    return [row[:5] for row in phases.rows]



def _phase_table(summary: dict, totals: dict[str, float], counts: dict[str, int]) -> Table:
    table = Table(title="phase times in seconds", title_justify="left")
    table.add_column("phase")
    table.add_column("count", justify="right")
    table.add_column("per iteration", justify="right")
    table.add_column("mean per micro-batch", justify="right")
    held = summary.get("compute_held_s")
    if held is not None:
        table.add_column("compute held", justify="right")
    for key, label in PHASE_ROWS.items():
        cells = [label, str(counts.get(key, "-")), _seconds(totals.get(key)),
                 _seconds(summary["phases_s"].get(key))]
        table.add_row(*cells, *([] if held is None else [_seconds(held.get(key))]))
    blank = [] if held is None else [""]
    if abs(totals.get(BETWEEN_PHASES, 0.0)) > 5e-4:
        table.add_row(BETWEEN_PHASES, "", _seconds(totals[BETWEEN_PHASES]), "", *blank)
        if reports := summary.get("memory_reports_s"):
            table.add_row(MEMORY_REPORTS, "", _seconds(reports), "", *blank)
    table.add_row("[bold]iteration[/bold]", "",
                  f"[bold]{_seconds(summary['iteration_s'])}[/bold]", "", *blank)
    return table


def _memory_table(summary: dict) -> Table | None:
    """Rank 0's GPU memory per phase, as DeepSpeed's `memory_breakdown` prints it after each
    phase (`Max_MA`, `MA`), the CUDA context included; None for a summary without it (one
    saved by an older zerosim)."""
    peaks, ends = summary.get("hbm_phase_peak_GiB"), summary.get("hbm_after_GiB")
    if not peaks or not ends:
        return None
    table = Table(title="rank 0's HBM by phase, GiB",
                  title_justify="left")
    table.add_column("phase")
    table.add_column("peak", justify="right")
    table.add_column("at its end", justify="right")
    for key, label in PHASE_ROWS.items():
        if peaks.get(key) is not None:
            table.add_row(label, f"{peaks[key]:.2f}", f"{ends[key]:.2f}")
    return table


def critical_path_table(path: RankPath) -> Table | None:
    """A rank's critical path per phase over the iteration (`results.critical.RankPath`):
    what the phase waited on, longest first, with its share of the phase; under it, the other
    ranks the path went through where the rank waited for them in a collective."""
    if not path.kinds:
        return None
    rank = path.rank
    table = Table(title=f"critical path of rank {rank}: what each phase waited on, seconds per "
                        "iteration", title_justify="left")
    table.add_column("phase")
    table.add_column("time", justify="right")
    table.add_column("longest first")
    for key, label in PHASE_ROWS.items():
        kinds = path.kinds.get(key)
        if not kinds:
            continue
        table.add_row(label, _seconds(ordered_sum(seconds for _, seconds in kinds)),
                      waits_text(kinds))
    if (ranks := through_text(path.through)) is not None:
        table.caption = (f"of which on other ranks' ops, where rank {rank} waited in a "
                         f"collective for the rank that joined it last: {ranks}")
        table.caption_justify = "left"
    return table


LARGE_TRACE_BYTES = 100_000_000
"""A full trace.json past this size gets a line on `zerosim run --compact-trace`."""


def render_summary(summary: dict, *, wall_s: float | None = None, out_dir=None,
                   phases=None, accumulation_steps: int = 1,
                   critical: RankPath | None = None,
                   large_trace_bytes: int | None = None,
                   other_readings: Sequence[str] = ()) -> None:
    """The summary of a run; with `phases` (Result.phases) the phase table has per-iteration
    totals beside the per-micro-batch means; with `critical` (the `results.critical.RankPath`
    of the rank that finishes last) a table of what each phase waited on follows it;
    `large_trace_bytes`: the size of a full trace.json past `LARGE_TRACE_BYTES`, which gets a
    line on `--compact-trace`; `other_readings`: the names of the profile's alternatives the
    run did not take, which get a line on `zerosim sensitivity`."""
    console = _console()
    status = summary["status"]
    colour = "green" if status == Status.OK else "red"
    nodes = summary["nodes"]
    over = f" over {nodes} nodes" if nodes > 1 else ""
    console.print(f"[bold]{summary['scenario']}[/bold]: status [{colour}]{status}[/{colour}], "
                  f"DP={summary['data_parallel']}{over}, DeepSpeed "
                  f"{summary['deepspeed_version']}")
    rank, totals, counts = iteration_totals(phases, accumulation_steps)
    if rank is not None:
        console.print(f"per iteration: the phases of rank {rank}, the last to finish; they add "
                      "up to the iteration\nmean per micro-batch: the slowest rank's\n"
                      "compute held: per micro-batch, how long other streams' kernels kept "
                      "compute off the SMs", highlight=False)
    console.print(_phase_table(summary, totals, counts))
    if critical is not None and (path := critical_path_table(critical)) is not None:
        console.print(path)
    if (step := summary.get("zenflow_step_s")) is not None:
        steps = round(summary["iteration_s"] / step)
        console.print(f"ZenFlow: an iteration is a window of {steps} training steps "
                      f"(update_interval), the last one the optimizer boundary: "
                      f"[bold]{_seconds(step)}[/bold] s per training step", highlight=False)
    memory = _memory_table(summary)
    if memory is not None:
        console.print(memory)
    facts = Table(show_header=False, box=None, pad_edge=False)
    tflops = summary["tflops_per_gpu"]
    facts.add_row("TFLOPS per GPU", "-" if tflops is None else f"{tflops:.1f}")
    if (tokens := summary.get("tokens_per_s")) is not None:
        facts.add_row("throughput", f"{tokens:,.0f} tokens/s over all GPUs "
                      f"({tokens / summary['data_parallel']:,.0f} per GPU)")
    facts.add_row("peak HBM", f"{summary['peak_hbm_GiB']:.2f} of "
                  f"{summary['hbm_capacity_GiB']:.2f} GiB (the fullest GPU)")
    facts.add_row("peak host memory", f"{summary['peak_host_GiB']:.1f} of "
                  f"{summary['host_capacity_GiB']:.0f} GiB (the fullest node)")
    if summary.get("peak_nvme_GiB"):
        facts.add_row("NVMe in use", f"{summary['peak_nvme_GiB']:.1f} GiB (swap files)")
    for direction in PCIE_STREAMS:
        mean = summary["pcie_mean_GBps"][direction]
        facts.add_row(f"PCIe {direction.upper()}",
                      f"{summary['pcie_GB'][direction]:.1f} GB over all GPUs"
                      + ("" if mean is None else f", {mean:.2f} GB/s mean per GPU"))
    if other_readings:
        facts.add_row("other readings", f"of {summary['hardware']}'s data: "
                      f"{', '.join(other_readings)} (zerosim sensitivity runs each beside "
                      "these values, --set hardware.alternative=NAME one)")
    if wall_s is not None:
        facts.add_row("simulated in", f"{wall_s:.2f} s")
    if out_dir is not None:
        facts.add_row("outputs", str(out_dir))
    if large_trace_bytes is not None:
        facts.add_row("trace", f"trace.json is {large_trace_bytes / 1e6:,.0f} MB, which trace "
                      "viewers open slowly if at all: --compact-trace keeps one rank per group "
                      "of ranks with identical timelines and samples each counter track")
    console.print(facts)
    for what, peak, capacity in tight_memory(summary):
        console.print(f"tight: peak {what} {peak:.2f} of {capacity:.2f} GiB is within "
                      f"{PEAK_ERROR_FRACTION:.0%} of the capacity, where zerosim's peaks can "
                      "err (zerosim validate): a real run may not fit", style="yellow",
                      markup=False, highlight=False)
    if summary.get("oom"):
        console.print(oom_text(summary["oom"]), style="red", markup=False, highlight=False)
        if (fits := capacity_that_fits(summary["oom"])) is not None:
            console.print(f"that allocation fits with --set {fits[0]}={fits[1]:.2f} (a later "
                          "one may need more): to time the configuration as if it fitted",
                          markup=False, highlight=False)


COMPARISON_ROWS = {**PHASE_ROWS, "between_phases": BETWEEN_PHASES, "iteration": "iteration"}
WAITS_SHOWN = 3
"""Kinds of wait per phase `zerosim diff` names, the largest changes first."""


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _setting_text(value) -> str:
    return "(absent)" if value is None else clip(str(value), 60)


def render_comparison(comparison, a_label: str, b_label: str, *,
                      settings_shown: int | None = 20) -> None:
    """`zerosim diff`: the settings that differ, then each phase of A and B with what moved on
    its critical path."""
    console = _console()
    console.print(f"A: {a_label} ({comparison.a_name})\nB: {b_label} ({comparison.b_name})",
                  markup=False, highlight=False)
    settings = comparison.settings
    if settings:
        console.print("settings that differ (scenario.json), A -> B:", highlight=False)
        derived = [key for key, _, _ in settings if key.startswith(DERIVED_SETTINGS)]
        if settings_shown is not None:
            settings = [row for row in settings if not row[0].startswith(DERIVED_SETTINGS)]
        shown = settings if settings_shown is None else settings[:settings_shown]
        for key, a, b in shown:
            console.print(f"  {key}: {_setting_text(a)} -> {_setting_text(b)}", markup=False,
                          highlight=False)
        if len(shown) < len(settings):
            console.print(f"  ... {len(settings) - len(shown)} more (--all-settings)",
                          highlight=False)
        if derived and settings_shown is not None:
            console.print(f"  and {len(derived)} DeepSpeed behaviours its version implies "
                          "(--all-settings lists them)", highlight=False)
    table = Table(title="seconds per iteration, each run's reported rank; what moved on the "
                        "critical path, B - A", title_justify="left")
    for column in ("phase", "A", "B", "change"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    table.add_column("moved most")
    for phase in comparison.phases:
        change = phase.change_s
        relative = ("" if change is None or not phase.a_s
                    else f" ({change / phase.a_s:+.0%})")
        moved = ", ".join(f"{w.kind} {_signed(w.change_s)}"
                          for w in phase.waits[:WAITS_SHOWN] if abs(w.change_s) >= 5e-4)
        label = COMPARISON_ROWS.get(phase.key, phase.key)
        table.add_row(label, _seconds(phase.a_s), _seconds(phase.b_s),
                      _signed(change) + relative, moved)
    console.print(table)
    for key, (a, b) in comparison.figures.items():
        if a != b:
            console.print(f"{key}: {_figure_text(a)} -> {_figure_text(b)}", markup=False,
                          highlight=False)


def _figure_text(value) -> str:
    return figure_text(value, 4) if isinstance(value, float) else str(value)


def render_validation(cells, out_dir) -> None:
    from zerosim.validation.report import format_value  # loads matplotlib: only here

    console = _console()
    table = Table(title="zerosim validate: simulated vs published", title_justify="left")
    for column in ("case", "quantity", "measured", "simulated", "error", "status"):
        table.add_column(column, justify="right" if column in ("measured", "simulated",
                                                                 "error") else "left")
    colours = {Verdict.PASS: "green", Verdict.FAIL: "red", Verdict.EXCLUDED: "yellow",
               Verdict.REPORTED: "cyan"}
    for c in cells:
        colour = colours[c.status]
        table.add_row(c.case, c.quantity, format_value(c.measured, c.unit),
                      *c.shown(format_value(c.simulated, c.unit)),
                      f"[{colour}]{c.status}[/{colour}]")
    console.print(table)
    judged = [c for c in cells if c.status in JUDGED]
    passed = sum(c.status == Verdict.PASS for c in judged)
    console.print(f"{passed} of {len(judged)} judged cells "
                  f"within tolerance; report in {out_dir}")


def render_calibration(fit, paths) -> None:
    console = _console()
    values = Table(title="fitted values", title_justify="left")
    for column in ("key", "start", "fitted", "bounds", "std error", "identified"):
        values.add_column(column)
    ident = fit.identifiability
    for p in fit.parameters:
        values.add_row(p.key, f"{p.start:.4g}", f"{fit.values[p.key]:.4g}",
                       f"{p.low:.3g} .. {p.high:.3g}",
                       f"{ident.rel_std[p.key]:.0%}" if ident else "",
                       ("yes" if ident.identified(p.key) else "NO") if ident else "")
    console.print(values)
    rows = Table(title="residuals", title_justify="left")
    for column in ("case", "split", "measured s", "simulated s", "error"):
        rows.add_column(column, justify="right" if column[-1] == "s" or column == "error"
                        else "left")
    for m in sorted(fit.train + fit.holdout, key=lambda m: m.row):
        split = "holdout" if m in fit.holdout else "train"
        rows.add_row(m.label, split, f"{m.seconds:.3f}", f"{fit.simulated[m.row]:.3f}",
                     f"{fit.rel_error(m):+.1%}")
    console.print(rows)
    console.print(f"rms relative error: train {fit.rms(fit.train):.1%}"
                  + (f", holdout {fit.rms(fit.holdout):.1%}" if fit.holdout else "")
                  + f"; {fit.iterations} evaluations")
    console.print("wrote " + ", ".join(str(p) for p in paths))


def render_tune(outcome, *, top: int = 10,
                best_path: RankPath | None = None) -> None:
    """The ranked configurations of `zerosim tune` (the best `top` that fit, then a count of
    the rest), why the best one wins and, with `best_path` (its reported rank's
    `results.critical.RankPath`), what each of its phases waits on."""
    from zerosim.tune import why_best

    console = _console()
    table = Table(title=f"zerosim tune {outcome.scenario.name}: fastest that fits",
                  title_justify="left")
    for column in ("#", "configuration", "iteration s", "tokens/s", "peak HBM GiB",
                   "peak host GiB"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    fitting = [r for r in outcome.rows if r["status"] == Status.OK]
    for row in fitting[:top]:
        table.add_row(str(row["rank"]), row["config"].describe(), f"{row['iteration_s']:.3f}",
                      f"{row['tokens_per_s']:,.0f}",
                      f"{row['peak_hbm_GiB']:.1f}" + ("*" if "HBM" in row["tight"] else ""),
                      f"{row['peak_host_GiB']:.1f}"
                      + ("*" if "host memory" in row["tight"] else ""))
    console.print(table)
    if any(row["tight"] for row in fitting[:top]):
        console.print(f"* within {PEAK_ERROR_FRACTION:.0%} of the device's memory, the most "
                      "zerosim's peaks sit from measured ones: a real run may not fit",
                      markup=False, highlight=False)
    counts: dict[str, int] = {}
    for row in outcome.rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    console.print(f"{len(outcome.rows)} configurations: "
                  + ", ".join(f"{n} {status}" for status, n in counts.items())
                  + f" ({outcome.simulated} simulated {outcome.executor} in "
                  f"{outcome.wall_s:.1f} s; pruned: the memory floor exceeds a device, an "
                  "NVMe offload whose host-memory twin fits, checkpoints in host memory "
                  "whose twin on the GPU fits, or a tiled call whose twin without it fits)",
                  markup=False, highlight=False)
    console.print(why_best(outcome.rows), markup=False, highlight=False)
    if best_path is not None and (path := critical_path_table(best_path)) is not None:
        path.title = f"the fastest, {path.title}"
        console.print(path)
    _print_files(console, outcome.files)


FILE_KINDS = {".png": "figure", ".svg": "figure", ".pdf": "figure", ".yaml": "scenario",
              ".json": "ds_config"}


def _print_files(console: Console, files) -> None:
    """What a command wrote, one line each: a table, a figure, a scenario or a ds_config."""
    for path in files:
        console.print(f"{FILE_KINDS.get(path.suffix, 'table')}: {path}", markup=False,
                      highlight=False)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


SENSITIVITY_WIDTH = 140
"""Columns the sensitivity table needs: the longest key, the basis, the value, five
elasticities."""
SENSITIVITY_HEADINGS = {"iteration": "iteration", "forward": "fwd",
                        "backward_non_boundary": "bwd", "backward_boundary": "bwd bnd",
                        "update": "update"}


def _elasticity_text(value: float | None) -> str:
    """Three decimals; what rounds to 0 is shown +0.000, not -0.000."""
    if value is None:
        return "-"
    return f"{0.0 if abs(value) < 0.0005 else value:+.3f}"


def _uncertainty_text(outcome) -> str:
    """What the stated standard errors give the iteration, and the assumed values that are
    not in it, largest elasticity first."""
    sigma, count = outcome.stated_sigma()
    assumed = [r for r in outcome.ranked() if r.basis == "assumed" and r.iteration]
    text = (f"the {_count(count, 'value')} with a stated standard error give "
            "the iteration "
            f"±{100 * sigma:.1f}% (1σ, first order, errors taken as independent; the values' "
            "own errors only, not the model's: `zerosim validate` shows that)"
            if count else "no value of this scenario states a standard error")
    if assumed:
        text += ("; not in it, the assumed values, largest first: "
                 + ", ".join(f"{r.key} ({r.iteration:+.3f})" for r in assumed[:5]))
    return text


def _change_text(change: float | None) -> str:
    return "-" if change is None else f"{100 * change:+.1f}%"


def _alternatives_table(outcome) -> Table:
    """Each alternative reading of the profile's data, run whole: what it sets and how much
    it changes the iteration and each phase (its source: the profile's file, or --json)."""
    from zerosim.sensitivity import QUANTITIES_SHOWN

    table = Table(title=f"alternative readings of {outcome.hardware}'s data, each run whole "
                        "(--set hardware.alternative=NAME; why each: the profile's file or "
                        "--json): % change of the time",
                  title_justify="left")
    table.add_column("alternative", no_wrap=True)
    table.add_column("sets")
    for q in QUANTITIES_SHOWN:
        table.add_column(SENSITIVITY_HEADINGS[q], justify="right", no_wrap=True)
    for reading in outcome.alternatives:
        alternative = reading.alternative
        name = alternative.name if alternative.carried_from is None else (
            f"{alternative.name} (from {alternative.carried_from})")
        sets = alternative.describe() + (f"; {reading.note}" if reading.note else "")
        table.add_row(name, sets, *(_change_text(reading.change(q, outcome.base))
                                    for q in QUANTITIES_SHOWN))
    return table


def _physics_text(outcome) -> str:
    """Whether every value moves the iteration the way a larger one can (a bandwidth shortening
    it, a latency lengthening it), else which do not (`Sensitivity.against_physics`)."""
    from zerosim.sensitivity import SHOWN_ELASTICITY

    against = outcome.against_physics()
    if not against:
        return ("against physics: none (no larger bandwidth, rate or efficiency lengthens the "
                f"iteration, and no larger latency or cost shortens it, by {SHOWN_ELASTICITY} "
                "per 1% or more)")
    listed = ", ".join(f"{row.key} {row.iteration:+.3f}" for row in against)
    return (f"against physics: {listed} (a larger value moves the iteration the other way "
            "from what it can do to it: contention can make that real, rarely by much; a "
            "large one is where to look for a fault)")


def render_sensitivity(outcome, *, everything: bool = False) -> None:
    """The values of `zerosim sensitivity`, ranked by their effect on the iteration, then the
    notes of the values that could not be moved both ways."""
    from zerosim.sensitivity import QUANTITIES_SHOWN, SHOWN_ELASTICITY

    console = _console(SENSITIVITY_WIDTH)
    base = outcome.base
    times = ", ".join(f"{SENSITIVITY_HEADINGS[q]} {base[q]:.3f} s"
                      for q in QUANTITIES_SHOWN if base[q] is not None)
    console.print(f"zerosim sensitivity {outcome.scenario_name} on {outcome.hardware} "
                  f"({times}): elasticity = % change of the time per 1% change of the value, "
                  f"each value at x(1 -/+ {outcome.step:g}), one at a time",
                  markup=False, highlight=False)
    table = Table()
    table.add_column("value", no_wrap=True)
    table.add_column("basis", no_wrap=True)
    table.add_column("now", justify="right", no_wrap=True)
    for q in QUANTITIES_SHOWN:
        table.add_column(SENSITIVITY_HEADINGS[q], justify="right", no_wrap=True)
    table.add_column("iter 1σ", justify="right", no_wrap=True)
    shown = outcome.ranked(everything=everything)
    for row in shown:
        sigma = row.iteration_sigma
        table.add_row(row.key, basis_text(row.basis, row.stderr), f"{row.value:g}",
                      *(_elasticity_text(row.elasticity(q)) for q in QUANTITIES_SHOWN),
                      "" if sigma is None else f"{100 * sigma:.2f}%")
    console.print(table)
    console.print(_uncertainty_text(outcome), markup=False, highlight=False)
    console.print(_physics_text(outcome), markup=False, highlight=False)
    if outcome.alternatives:
        console.print(_alternatives_table(outcome))
    for row in shown:
        if row.note:
            console.print(f"{row.key}: {row.note}", markup=False, highlight=False)
    hidden = len(outcome.rows) - len(shown)
    tail = (f"; {hidden} more move the iteration by less than {SHOWN_ELASTICITY} per 1% "
            "(--all lists them)") if hidden else ""
    console.print(f"{_count(len(outcome.rows), 'value')}, {outcome.runs} runs "
                  f"{outcome.executor} in {outcome.wall_s:.1f} s{tail}",
                  markup=False, highlight=False)
    _print_files(console, outcome.files)


PREDICTIONS_WIDTH = 160
"""Columns the predictions table needs: the configuration, the GPUs, five predicted/measured
pairs with their errors."""
PREDICTION_STATUS = {Status.OK: "simulated", Status.OOM: "do not fit", Status.REFUSED: "refused",
                     Status.ERROR: "could not be simulated"}
PREDICTION_HEADINGS = {"forward": "fwd", "backward": "bwd", "update": "update",
                       "iteration": "iteration", PEAK_ALLOCATED: "rank 0 GiB",
                       PEAK_HOST: "node host GiB", BETWEEN_PHASES_QUANTITY: "between phases"}
"""Headings of `zerosim predict`'s tables, by `zerosim.runs.QUANTITIES` (and the series'
`BETWEEN_PHASES`, the run table's row)."""


def _prediction_cell(prediction, quantity: str) -> str:
    """'12.34/12.00 +2.8%': predicted, measured and the error; the prediction alone when
    the table has no measurement."""
    scale, digits = (GiB, 1) if quantity in MEMORY_QUANTITIES else (1.0, 2)
    predicted, measured = prediction.predicted.get(quantity), prediction.measured(quantity)
    if predicted is None:
        return "-"
    text = f"{predicted / scale:.{digits}f}"
    if measured is None:
        return text
    return f"{text}/{measured / scale:.{digits}f} {prediction.rel_error(quantity):+.1%}"


def render_alternative_predictions(outcome, readings) -> None:
    """`zerosim predict --alternatives`: each configuration's iteration at the values shipped
    and at each alternative reading of the profile's data, then each reading's rms error over
    the measured configurations: which reading the table's runs take."""
    from zerosim.runs import MEASURED_PHASES

    console = _console(PREDICTIONS_WIDTH)
    table = Table(title=f"alternative readings of {outcome.hardware}'s data: the iteration per "
                        "optimizer step, predicted/measured error", title_justify="left")
    table.add_column("configuration", no_wrap=True)
    table.add_column("shipped", justify="right", no_wrap=True)
    for reading in readings:
        table.add_column(reading.name, justify="right", no_wrap=True)
    for k, p in enumerate(outcome.predictions):
        table.add_row(p.scenario_name, _prediction_cell(p, "iteration"),
                      *(_prediction_cell(r.outcome.predictions[k], "iteration")
                        for r in readings))
    console.print(table)
    for name, sets, result in [("shipped", "", outcome),
                               *((r.name, r.sets, r.outcome) for r in readings)]:
        parts = [f"{PREDICTION_HEADINGS[q]} {rms:.1%}" for q in MEASURED_PHASES
                 if (rms := result.rms(q)) is not None]
        if parts:
            console.print(f"{name}{f' ({sets})' if sets else ''}: rms " + ", ".join(parts),
                          markup=False, highlight=False)


def render_predictions(outcome, series=()) -> None:
    """`zerosim predict`: each configuration predicted against its measurements, then the
    rms and largest error of each quantity, the repeats' scatter and the accumulation series
    (`series`, from `zerosim.series.accumulation_series`)."""
    from zerosim.runs import QUANTITIES

    console = _console(PREDICTIONS_WIDTH)
    table = Table(title=f"zerosim predict {outcome.source} on {outcome.hardware}: seconds per "
                        "optimizer step (all micro-batches), predicted/measured error",
                  title_justify="left")
    table.add_column("configuration", no_wrap=True)
    table.add_column("GPUs", justify="right", no_wrap=True)
    for quantity in QUANTITIES:
        table.add_column(PREDICTION_HEADINGS[quantity], justify="right", no_wrap=True)
    for p in outcome.predictions:
        repeats = len(p.configuration.runs)
        name = p.scenario_name + (f" x{repeats}" if repeats > 1 else "")
        gpus = f"{p.configuration.first.gpus}" + (f"/{p.nodes}n" if p.nodes > 1 else "")
        if not p.predicted:
            table.add_row(name, gpus, p.status.upper(), *([""] * (len(QUANTITIES) - 1)))
            continue
        table.add_row(name + (" *" if p.status != Status.OK else ""), gpus,
                      *(_prediction_cell(p, q) for q in QUANTITIES))
    console.print(table)
    for p in outcome.predictions:
        if p.error or p.oom:
            timed = (f"; * timed with {p.timed_with_text}, as the measured runs fitted"
                     if p.timed_with else "")
            console.print(f"{p.scenario_name}: {p.error or p.oom}{timed}", markup=False,
                          highlight=False)
        elif p.tight:
            console.print(f"{p.scenario_name}: tight: {p.tight}, within "
                          f"{PEAK_ERROR_FRACTION:.0%} (the memory model's error): a real run "
                          "may not fit", markup=False, highlight=False)
    parts = []
    for quantity in QUANTITIES:
        errors = outcome.errors(quantity)
        if errors:
            parts.append(f"{PREDICTION_HEADINGS[quantity]} rms {outcome.rms(quantity):.1%}, "
                         f"largest {max(errors, key=abs):+.1%} ({len(errors)})")
    for refused in outcome.refused_rows:
        console.print(f"refused: {refused.error}", markup=False, highlight=False)
    statuses = {status: sum(p.status == status for p in outcome.predictions)
                for status in PREDICTION_STATUS}
    timed = sum(bool(p.timed_with) for p in outcome.predictions)
    tight = sum(bool(p.tight) for p in outcome.predictions)
    how = ", ".join(f"{n} {PREDICTION_STATUS[status]}" for status, n in statuses.items() if n)
    if timed:
        how += f" ({timed} of them timed with more memory)"
    if tight:
        how += f", {tight} tight"
    unread = (f"; {_count(len(outcome.refused_rows), 'row')} of the table refused"
              if outcome.refused_rows else "")
    console.print(f"{_count(len(outcome.predictions), 'configuration')} ({how}; "
                  f"{outcome.executor} in {outcome.wall_s:.1f} s{unread})"
                  + (": " + "; ".join(parts) if parts else ": nothing measured to compare"),
                  markup=False, highlight=False)
    if (repeats := _repeats_text(outcome)):
        console.print(repeats, markup=False, highlight=False)
    if (off := _off_repeats_text(outcome)):
        console.print(off, markup=False, highlight=False)
    _print_series(console, series)
    _print_files(console, outcome.files)




def _print_series(console: Console, series) -> None:
    """The table's gradient-accumulation series (`zerosim.series.accumulation_series`), each
    time split into what a micro-batch adds and what the step costs once, predicted against
    measured."""
    if not series:
        return
    table = Table(title="gradient-accumulation series: each time per optimizer step = per step "
                        "+ per micro-batch x accumulation (least squares over the runs), "
                        "predicted/measured", title_justify="left")
    for heading in ("series", "runs", "time", "per micro-batch", "per step"):
        table.add_column(heading, justify="left" if heading == "series" else "right",
                         no_wrap=True)
    for s in series:
        for split in s.splits:
            error = split.error_per_micro_batch
            table.add_row(s.name, str(s.runs), PREDICTION_HEADINGS[split.quantity],
                          f"{split.predicted.per_micro_batch_s:.3f}/"
                          f"{split.measured.per_micro_batch_s:.3f}"
                          + ("" if error is None else f" {error:+.1%}"),
                          f"{split.predicted.per_step_s:.2f}/{split.measured.per_step_s:.2f} "
                          f"{split.difference_per_step_s:+.2f} s")
    console.print(table)


def _repeats_text(outcome) -> str:
    """How far the table's repeated runs scatter, quantity by quantity: the finest error a
    prediction can be judged at ('' when no configuration was measured twice)."""
    from zerosim.runs import QUANTITIES

    repeated = [p for p in outcome.predictions if len(p.configuration.runs) > 1]
    parts = []
    for quantity in QUANTITIES:
        widest = outcome.widest_spread(quantity)
        if widest is not None:
            spread, p = widest
            parts.append(f"{PREDICTION_HEADINGS[quantity]} {spread:.1%} ({p.scenario_name})")
    if not parts:
        return ""
    scatter = ", ".join(f"{PREDICTION_HEADINGS[q]} {sd:.1%}" for q in QUANTITIES
                        if (sd := outcome.run_to_run_sd(q)) is not None)
    return (f"repeats: {_count(len(repeated), 'configuration')} measured more than once; "
            f"their runs differ (largest - smallest, over the mean) by up to "
            + ", ".join(parts) + ": errors within these are measurement noise; one run "
            f"scatters about its configuration's mean by (standard deviation, pooled) {scatter}")


def _off_repeats_text(outcome) -> str:
    """The runs a phase of which sits far from their configuration's other runs
    (`runs.runs_off_their_repeats`), and what to do with one on a slower GPU."""
    from zerosim.runs import OFF_REPEATS, runs_off_their_repeats

    off = runs_off_their_repeats(p.configuration for p in outcome.predictions)
    if not off:
        return ""
    listed = "; ".join(
        f"{o.configuration}: row {o.run.row} over {_rows(o.others)}: " + ", ".join(
            f"{PREDICTION_HEADINGS[phase]} {d:+.1%}" for phase, d in o.deviations.items())
        for o in off)
    return (f"runs off their repeats (a phase {OFF_REPEATS:.0%} or more from the mean of the "
            f"same configuration's other runs): {listed}. A run whose fwd and bwd are slower "
            "together while its update (on the CPU) is not ran its GPU at a lower clock: "
            "`--set hardware.gpu.sm_clock_fraction=...` replays it (docs/profiles.md)")


def _rows(rows: tuple[int, ...]) -> str:
    return ("row " if len(rows) == 1 else "rows ") + ", ".join(str(r) for r in rows)


def _domains_text(shares: Shares, domains: int) -> str:
    if everywhere(shares, domains):
        return "every domain"
    return ", ".join(str(domain) for domain, _ in shares)


def _placement_text(scenario: Scenario) -> str:
    """Per rank of the first node: its GPU's NUMA domain, where the buffers its host thread
    allocates sit (pinned fp32 partition, gradients), where its CPU pool's pages and threads
    are (`hardware.placement`)."""
    hw = scenario.hardware
    placements = place_ranks(hw, scenario.ranks_on_fullest_node,
                             bound=scenario.runtime.bind_cores_to_rank,
                             core_order=scenario.runtime.bind_core_list)
    return "; ".join(
        f"rank {pl.rank}: GPU on {hw.gpu_domain(pl.gpu)}, own buffers on "
        f"{_domains_text(pl.home, hw.numa_domains)}, pool on "
        f"{_domains_text(pl.threads, hw.numa_domains)}" for pl in placements)


TRANSPORT_TEXT = {
    PeerTransport.PCIE_P2P: "peer-to-peer over PCIe (its P2P transport)",
    PeerTransport.SHM: "through host memory (its SHM transport)",
}


def _gpu_links_text(hw: HardwareProfile) -> str | None:
    """How a node's GPUs reach each other and the host, where it is not NVLink beside a
    PCIe link of each GPU's own (nothing to say then)."""
    parts = []
    if hw.intra_node_transport is not PeerTransport.NVLINK:
        parts.append(f"NCCL's ring {TRANSPORT_TEXT[hw.intra_node_transport]} at "
                     f"{hw.nvlink_Bps / GB:g} GB/s, on each GPU's PCIe link beside its copies")
    if hw.gpus_per_switch > 1:
        parts.append(f"{hw.gpus_per_switch} GPUs behind each PCIe switch, sharing its "
                     f"{hw.switch_uplink_Bps / GB:g} GB/s uplink to the CPU")
    return "; ".join(parts) or None


def _pools_text(pools: CpuPools) -> str:
    """The ranks' OpenMP pools against the node's hardware threads, and what oversubscribing
    them costs."""
    text = (f"{_count(pools.ranks_on_node, 'rank')} x {pools.threads_per_rank} OpenMP threads "
            f"on {pools.hardware_threads} hardware threads")
    if pools.oversubscription <= 1:
        return text + ": not oversubscribed"
    return (text + f": oversubscribed x{pools.oversubscription:.2f}, {pools.capacity_threads:.0f} "
            f"threads' worth of throughput shared, each OpenMP region waits "
            f"{pools.region_wait_s / MS:.2f} ms more (runtime.cpu_threads_per_rank "
            f"{pools.filling_threads} would not oversubscribe)")


def _adam_text(scenario: Scenario) -> str:
    """What a sub-group's CPU Adam step runs at with the node's ranks stepping together, and
    what holds it, timed on the engine's machine model."""
    from zerosim.engine.probes import node_adam_rates

    def rate(value: float) -> str:
        return re.sub(r"e\+?0*(\d)", r"e\1", f"{value:.3g}")

    rates = node_adam_rates(scenario)
    ds = scenario.deepspeed
    dtypes = (f" over {ds.master_dtype} params with {ds.optimizer_state_dtype} moments"
              if ds.low_precision_master else "")
    return (f"{rate(rates.params_per_s)} params/s per rank{dtypes}, "
            f"{_count(rates.ranks, 'rank')} "
            f"stepping at once: held by {rates.binding} (the threads' ceiling "
            f"{rate(rates.threads_params_per_s)}, host memory's {rate(rates.memory_params_per_s)})")


def _reports_text(scenario: Scenario) -> str:
    """What `memory_breakdown` costs: the engine's memory reports, each rank 0's
    `gc.collect()` (empty without it)."""
    from zerosim.engine.probes import memory_reports

    reports = memory_reports(scenario)
    if reports is None:
        return ""
    return (f"{reports.per_step} memory reports a step (memory_breakdown), each a "
            f"gc.collect() over {reports.objects:,.0f} objects: {reports.each_s * 1e3:.1f} ms, "
            f"{reports.per_step_s:.3f} s a step")


def _threads_text(scenario: Scenario) -> str:
    """The rank's OpenMP pool as chosen, and whether the launcher binds it."""
    runtime = scenario.runtime
    if not runtime.bind_cores_to_rank:
        return str(runtime.cpu_threads_per_rank or "one per physical core")
    chosen = runtime.cpu_threads_per_rank or "the rank's share of the physical cores"
    return f"{chosen}, cores and memory bound per rank (bind_cores_to_rank)"


def _yes_no(value: bool | str) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return value
