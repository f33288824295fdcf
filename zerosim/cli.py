"""Command line: parsing and printing only; the work happens in the library."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from zerosim.errors import ScenarioError, ZerosimError, clip
from zerosim.interrupts import Interrupted, handled_interrupts, received_signal
from zerosim.tune import KNOBS
from zerosim.vocabulary import Status

if TYPE_CHECKING:
    from zerosim.results.critical import RankPath
    from zerosim.scenario import Scenario

SET_HELP = "Override a scenario value by dotted path, e.g. deepspeed.zero_optimization.stage=2."

EXIT_OK = 0
EXIT_POINTS_NOT_RUN = 1   # sweep: points not run; predict: rows refused or not simulated
EXIT_BAD_INPUT = 2        # a scenario, profile, ds_config, option or output folder is refused
EXIT_OOM = 3              # run: the configuration does not fit (summary status "oom")
EXIT_INTERNAL_ERROR = 70  # a bug in zerosim (EX_SOFTWARE)
TRACEBACK_ENV = "ZEROSIM_TRACEBACK"
ON_INTERRUPT = "zerosim.on_interrupt"


class _ZerosimGroup(click.Group):
    """Every command ends with one line, never a traceback: zerosim's own errors exit 2, Ctrl-C
    130 and SIGTERM 143 (whatever was running when the signal came), a bug 70."""

    def invoke(self, ctx: click.Context):
        with handled_interrupts():
            try:
                return super().invoke(ctx)
            except (click.exceptions.Exit, click.ClickException, click.Abort):
                raise
            except KeyboardInterrupt as err:
                _stop_interrupted(ctx, getattr(err, "signum", 2))
            except ZerosimError as err:
                if received_signal() is not None:
                    _stop_interrupted(ctx, received_signal())
                click.echo(f"error: {err}", err=True)
                sys.exit(EXIT_BAD_INPUT)
            except Exception as err:
                if received_signal() is not None:
                    _stop_interrupted(ctx, received_signal())
                if os.environ.get(TRACEBACK_ENV):
                    raise
                click.echo(f"error: internal error, a bug in zerosim (please report it; "
                           f"{TRACEBACK_ENV}=1 shows the traceback): {type(err).__name__}: "
                           f"{clip(str(err), 300)}", err=True)
                sys.exit(EXIT_INTERNAL_ERROR)


def _stop_interrupted(ctx: click.Context, signum: int) -> None:
    stop = Interrupted(signum)
    note = ctx.meta.get(ON_INTERRUPT)
    click.echo(f"interrupted by {stop.signal_name}" + (f": {note}" if note else ""), err=True)
    sys.exit(stop.exit_status)


def _on_interrupt(note: str) -> None:
    """What an interruption from here on leaves behind, said in the one line it prints."""
    click.get_current_context().meta[ON_INTERRUPT] = note


@click.group(cls=_ZerosimGroup, epilog="""\b
Exit status: 0 done; 1 sweep: some points could not be run, predict: some rows refused or not
simulated; 2 bad input (scenario, profile, ds_config, option or output folder; one line names
the file, the key, what was expected and what was given); 3 run: the configuration does not
fit (status oom); 70 a bug in zerosim; 130 interrupted by Ctrl-C; 143 by SIGTERM.
\b
Inputs are UTF-8 YAML or JSON files of at most 1 MiB: no key twice in a mapping, at most 32
levels of nesting, no alias expanding past 100,000 values, and every number within its key's
plausible range (zerosim/inputs/plausible.py); true/false is never a number. Outputs are
written beside --out and moved into place whole: an interrupted run leaves the previous
output or none.""")
@click.version_option(package_name="zerosim")
def main() -> None:
    """zerosim: replay a DeepSpeed ZeRO offloaded training iteration on a hardware model."""


def _print_json(data) -> None:
    from zerosim.results.export import strict_json

    click.echo(strict_json(data, indent=2, sort_keys=False, default=str))


def scenario_argument(func):
    """The SCENARIO argument and repeatable --set, shared by every command that takes one."""
    func = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                        help=SET_HELP)(func)
    return click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))(func)


def _output_folder(folder: Path) -> Path:
    """`folder`, once known to take the files of a command that adds them to it (`plot`,
    `validate`, `calibrate`, `sweep`, `tune`, `sensitivity`, `predict`): checked before
    anything is simulated."""
    from zerosim.results.folders import check_output_folder

    check_output_folder(folder, replaceable=False)
    return folder


def _files_needed(no_files: bool, wanted: bool, options: str = "--plots") -> None:
    """Refuse `options` (what writes files, as typed) beside --no-files."""
    if wanted and no_files:
        verb = "write" if " and " in options else "writes"
        raise click.UsageError(f"{options} {verb} files; drop --no-files")


def table_options(table: str, default_folder: str):
    """--workers, --out, --no-files and --json: the options of a command that simulates many
    points on the sweep executors and writes one table."""
    options = (
        click.option("--workers", type=click.IntRange(min=1),
                     help="Parallel workers (default: one per CPU); 1 runs in this process."),
        click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
                     help=f"Folder for {table} (default: {default_folder})."),
        click.option("--no-files", is_flag=True, help="Only print the table; write nothing."),
        click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON."))

    def decorate(func):
        for option in reversed(options):
            func = option(func)
        return func
    return decorate


def _load(scenario: Path, overrides: tuple[str, ...]):
    """Load a scenario, showing each of its warnings once on stderr."""
    from zerosim.errors import ScenarioError
    from zerosim.scenario import load_scenario, parse_overrides
    from zerosim.scenario.loader import with_override_origin

    try:
        return _with_warnings(lambda: load_scenario(scenario, overrides))
    except ScenarioError as err:
        raise with_override_origin(err, parse_overrides(overrides)) from None


SEQUENCE_HELP = ("Sequence length for the FLOPs per token of a Hugging Face config.json "
                 "(a scenario has its own).")
DEFAULT_SEQUENCE = 2048
FRAMEWORK_HELP = ("A software stack (runtime.framework) to cut a --model or config.json into "
                  "modules as it does (hf-transformers: a block's experts in one module, as "
                  "transformers 5 holds them); a scenario has its own.")


def _model_summary(spec, sequence_length: int, recipe=None):
    """The model's counts and modules, cut as `recipe` (a scenario's stack) cuts it; a
    config.json alone, as its model's code is read."""
    from zerosim.models.summary import summarize

    return summarize(spec, sequence_length, recipe)


def _stack_recipe(name: str):
    """The module cut of the built-in stack `name` (`--framework`)."""
    from zerosim.stacks import load_stack, stack_names

    if name not in stack_names():
        raise ScenarioError(None, "--framework", f"one of {', '.join(stack_names())}", name)
    return load_stack(name).recipe


def _hf_spec(path: Path, key_path: str):
    """A model from a config.json, showing its warnings on stderr."""
    from zerosim.models import spec_from_hf_file

    return _with_warnings(lambda: spec_from_hf_file(path, source=str(path), key_path=key_path))


def _with_warnings(load):
    from zerosim.errors import with_scenario_warnings

    loaded, warned = with_scenario_warnings(load)
    for warning in warned:
        click.echo(f"warning: {warning}", err=True)
    return loaded


def _without_scenario_warnings(run):
    """`run()` with `ScenarioWarning`s silenced: the command showed the scenario's own as it
    loaded it (`_load`), and the configurations it derives from it would repeat them."""
    import warnings

    from zerosim.errors import ScenarioWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScenarioWarning)
        return run()


def _cpu_adam(scenario: Scenario) -> dict[str, Any]:
    """`check --json`'s `cpu_adam`, where the optimizer steps on the CPU (what its `cpu adam`
    line says)."""
    if not scenario.deepspeed.offload_optimizer.enabled:
        return {}
    from zerosim.engine.probes import node_adam_rates

    return {"cpu_adam": node_adam_rates(scenario).to_dict()}


def _zero3_leaves(scenario: Scenario) -> dict[str, Any]:
    """`check --json`'s `leaves`, where ZeRO-3 makes leaves of the model (what its `leaves`
    line says): each one's name and the first and last of the modules its hooks fetch."""
    from zerosim.engine.plan import leaves_of, plan_of

    found = leaves_of(scenario)
    if not found.names:
        return {}
    modules = plan_of(scenario).modules
    return {"leaves": [{"name": name, "first_module": modules[first].name,
                        "last_module": modules[last].name, "modules": last - first + 1}
                       for name, (first, last) in zip(found.names, found.spans, strict=True)]}


def _zero_plus_plus(scenario: Scenario) -> dict[str, Any]:
    """`check --json`'s `zero_plus_plus`, where ZeRO-3 runs hpZ, qwZ or qgZ over several
    ranks (what its `mode` line says): the hpZ group, the bytes each rank's secondary
    partitions hold, whether the all-gathers are quantized, and whether the gradients are
    (qgZ acts across nodes only)."""
    from zerosim.engine.plan import hpz_secondary_bytes, loco_error_feedback_bytes

    ds = scenario.deepspeed
    group = ds.zero_plus_plus.hpz_group(scenario.data_parallel)
    gradients = ds.zero_plus_plus.quantizes_gradients(ds.stage, scenario.data_parallel,
                                                      scenario.hardware.gpus_per_node)
    if (ds.stage != 3 or scenario.data_parallel == 1
            or not (ds.zero_plus_plus.any or gradients)):
        return {}
    return {"zero_plus_plus": {
        "hpz_group": group, "secondary_bytes_per_rank": hpz_secondary_bytes(scenario),
        "secondary_on": ("host" if ds.offload_param.device == "cpu" else "gpu") if group > 1
        else None, "quantized_weights": ds.zero_plus_plus.quantized_weights,
        "quantized_gradients": gradients,
        "loco_error_feedback_bytes": loco_error_feedback_bytes(scenario)}}


def _mics(scenario: Scenario) -> dict[str, Any]:
    """`check --json`'s `mics`, where ZeRO-3 runs MiCS (what its `mode` line says): the
    ranks a shard group partitions over, how many groups hold replicas, whether the gather
    is hierarchical."""
    ds = scenario.deepspeed
    if not ds.mics.acts(ds.stage):
        return {}
    return {"mics": {"shard_size": ds.mics.shard_size,
                     "replicas": ds.mics.replicas(ds.stage, scenario.data_parallel),
                     "hierarchical_gather": ds.mics.hierarchical}}


def _sequence_parallel(scenario: Scenario) -> dict[str, Any]:
    """`check --json`'s `sequence_parallel`, where Ulysses runs (what its `mode` line says):
    the group's size, how many groups train sequences side by side, the tokens a rank's
    modules take per micro-batch and the dtype ZeRO reduces gradients in."""
    ds = scenario.deepspeed
    size = ds.sequence_parallel_size
    if size == 1:
        return {}
    return {"sequence_parallel": {
        "size": size, "groups": ds.sequence_groups(scenario.data_parallel),
        "tokens_per_rank": (scenario.sequence_length * ds.train_micro_batch_size_per_gpu
                            // size),
        "communication_dtype": ds.communication_dtype}}


def _tiling(scenario: Scenario) -> dict[str, Any]:
    """`check --json`'s `tiling`, where a tiled call runs (what its `mode` line says): the
    slices of the MLP (and whether their count is agreed on every call) and of the loss."""
    from zerosim.engine.plan import workload_of

    w = workload_of(scenario)
    if not (w.tiled_mlp_shards or w.tiled_loss_shards):
        return {}
    return {"tiling": {"mlp_shards": w.tiled_mlp_shards, "mlp_agreed": w.tiled_mlp_agreed,
                       "loss_shards": w.tiled_loss_shards}}


def _liger(scenario: Scenario) -> dict[str, Any]:
    """`check --json`'s `liger_kernel`, where Liger-Kernel's kernels run (what its `mode` line
    says): the chunks of tokens its fused linear cross entropy runs."""
    from zerosim.report import liger_loss_rows

    if not scenario.runtime.liger_kernel:
        return {}
    rows = liger_loss_rows(scenario)
    return {"liger_kernel": {"loss_chunks": len(rows), "chunk_tokens": rows[0]}}


def _memory_reports(scenario: Scenario) -> dict[str, Any]:
    """`check --json`'s `memory_reports`, where `memory_breakdown` is on (what its `breakdown`
    line says)."""
    from zerosim.engine.probes import memory_reports

    reports = memory_reports(scenario)
    return {} if reports is None else {"memory_reports": reports.to_dict()}


@main.command()
@scenario_argument
@click.option("--json", "as_json", is_flag=True, help="Print the resolved scenario as JSON.")
@click.option("--sequence-length", type=click.IntRange(min=1), default=DEFAULT_SEQUENCE,
              show_default=True, help=SEQUENCE_HELP)
@click.option("--framework", help=FRAMEWORK_HELP)
def check(scenario: Path, overrides: tuple[str, ...], as_json: bool,
          sequence_length: int, framework: str | None) -> None:
    """Validate a scenario and print it with every default filled in, and its model's
    parameters, per-module breakdown and FLOPs per token. A Hugging Face config.json prints
    the model part alone."""
    from zerosim.models.hf import looks_like_hf_config
    from zerosim.report import render_scenario

    if looks_like_hf_config(scenario):
        if overrides:
            raise click.UsageError("--set applies to a scenario, not to a config.json")
        recipe = None if framework is None else _stack_recipe(framework)
        summary = _model_summary(_hf_spec(scenario, "<root>"), sequence_length, recipe)
        _print_json(summary.to_dict()) if as_json else click.echo(summary.to_text())
        return
    if framework is not None:
        raise click.UsageError("--framework goes with a config.json (a scenario names its "
                               "own: runtime.framework)")
    loaded = _load(scenario, overrides)
    summary = _model_summary(loaded.model, loaded.sequence_length, loaded.stack.recipe)
    if as_json:
        _print_json({**loaded.to_dict(), "model_summary": summary.to_dict(),
                     **_cpu_adam(loaded), **_memory_reports(loaded), **_zero3_leaves(loaded),
                     **_zero_plus_plus(loaded), **_mics(loaded),
                     **_sequence_parallel(loaded), **_tiling(loaded), **_liger(loaded)})
    else:
        render_scenario(loaded)
        click.echo(summary.to_text())


def default_out_dir(name: str) -> Path:
    return Path("results") / name


@main.command(epilog="Exit status: 0 ok, 2 bad input, 3 the configuration does not fit (oom), "
                     "130/143 interrupted (the output folder is left as it was).")
@scenario_argument
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the output files (default: results/<scenario name>); checked "
                   "before simulating, replaced whole when the run ends.")
@click.option("--no-files", is_flag=True, help="Only print the summary; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--plots", is_flag=True,
              help="Also draw the timeline, memory, PCIe and phase figures, and where each "
                   "phase's time goes on rank 0 (PNG and SVG).")
@click.option("--no-progress", is_flag=True,
              help="No progress line on stderr (shown on a terminal for runs over 2 s).")
@click.option("--compact-trace", is_flag=True,
              help="A smaller trace.json for large runs: one rank per group of ranks with "
                   "identical timelines, counters sampled to 2000 points per track (maximum "
                   "and end level per interval). The tables stay whole.")
@click.option("--explain", is_flag=True,
              help="What each phase waited on, its critical path, also with --no-files (the "
                   "host thread recorded: a quarter to a third more time) and in --json "
                   "(waits_on).")
def run(scenario: Path, overrides: tuple[str, ...], out_dir: Path | None, no_files: bool,
        as_json: bool, plots: bool, no_progress: bool, compact_trace: bool,
        explain: bool) -> None:
    """Simulate one training iteration and write its timeline, memory curves and trace."""
    import time

    from zerosim.api import simulate, simulate_brief
    from zerosim.progress import RunProgress
    from zerosim.report import render_summary
    from zerosim.results.folders import check_output_folder

    _files_needed(no_files, plots or compact_trace, "--plots and --compact-trace")
    _files_needed(no_files, out_dir is not None, "--out")
    loaded = _load(scenario, overrides)
    target = None if no_files else out_dir or default_out_dir(loaded.name)
    if target is not None:
        check_output_folder(target)
        _on_interrupt(f"{target} was left as it was")
    started = time.perf_counter()
    with RunProgress(enabled=False if no_progress else None) as progress:
        if no_files:  # the summary and the phases alone: no tables to build
            result = simulate_brief(loaded, observer=progress.observe, explain=explain)
        else:
            result = simulate(loaded, observer=progress.observe)
    wall = time.perf_counter() - started
    if target is not None:
        from zerosim.results.export import write_outputs

        write_outputs(result, target, extra={"scenario.json": loaded.to_dict()},
                      figures=_draw_figures if plots else None, compact_trace=compact_trace,
                      on_published=lambda: _on_interrupt(f"{target} holds this run's result"))
    critical = result.critical if no_files else _critical_totals(result)
    if as_json:
        _print_json(_with_waits(result.summary, critical) if explain else result.summary)
    else:
        render_summary(result.summary, wall_s=wall, out_dir=target, phases=result.phases,
                       accumulation_steps=loaded.deepspeed.gradient_accumulation_steps,
                       critical=critical,
                       large_trace_bytes=None if compact_trace else _large_trace(target),
                       other_readings=[a.name for a in loaded.hardware.other_alternatives])
    if result.summary["status"] == Status.OOM:
        sys.exit(EXIT_OOM)


def _large_trace(folder: Path | None) -> int | None:
    """The size of the trace.json a run wrote into `folder`, where it is past
    `report.LARGE_TRACE_BYTES`."""
    from zerosim.report import LARGE_TRACE_BYTES

    trace = None if folder is None else Path(folder) / "trace.json"
    size = trace.stat().st_size if trace is not None and trace.is_file() else 0
    return size if size > LARGE_TRACE_BYTES else None


def _with_waits(summary: dict, critical: RankPath | None) -> dict:
    """The summary with `waits_on` (`results.critical.waits_texts`; None for a run that did
    not fit), as `simulate_summary(explain=True)` gives it."""
    from zerosim.results.critical import WAITS_ON, waits_texts

    return {**summary, WAITS_ON: None if critical is None else waits_texts(critical)}


def _critical_totals(result) -> RankPath | None:
    """What each phase of the reported rank waited on, per phase time (the critical-path
    table of `zerosim run` and `zerosim tune`); None without phases."""
    from zerosim.results.critical import rank_path, reported_rank

    rank = reported_rank(result)
    return None if rank is None else rank_path(result.critical_path, rank)


def _draw_figures(result, folder: Path) -> None:
    from zerosim.plots import save_all

    save_all(result, folder)


@main.command(epilog="Exit status: 0 compared, 2 bad input (a folder that is no zerosim result, "
                     "a scenario refused, nothing to compare).")
@click.argument("run_a", metavar="A", type=click.Path(exists=True, path_type=Path))
@click.argument("run_b", metavar="[B]", required=False,
                type=click.Path(exists=True, path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a value of B's scenario; without B, B is A's scenario so changed "
                   "(a what-if in one command).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--all-settings", is_flag=True,
              help="List every setting that differs (default: the first 20).")
def diff(run_a: Path, run_b: Path | None, overrides: tuple[str, ...], as_json: bool,
         all_settings: bool) -> None:
    """Compare two runs: the settings that differ, each phase's seconds per iteration, and what
    moved on its critical path (B - A). A and B are each a folder `zerosim run` wrote or a
    scenario, which is simulated with every record (nothing is written)."""
    from zerosim.report import render_comparison
    from zerosim.results.compare import compare

    if run_b is None and not overrides:
        raise click.UsageError("nothing to compare: give B, or --set to change A's scenario")
    if run_b is None and run_a.is_dir():
        raise click.UsageError(f"--set changes a scenario, and {run_a} is a result folder: "
                               "give B")
    a = _run_to_compare(run_a, ())
    b = _run_to_compare(run_b or run_a, overrides)
    comparison = compare(a[0], b[0], a[1], b[1])
    label_b = str(run_b or run_a) + (f" --set {' --set '.join(overrides)}" if overrides else "")
    if as_json:
        _print_json(comparison.as_dict())
    else:
        render_comparison(comparison, str(run_a), label_b,
                          settings_shown=None if all_settings else SETTINGS_SHOWN)


def _run_to_compare(where: Path, overrides: tuple[str, ...]):
    """(Result, its resolved scenario as a dict or None) of a result folder (with no
    overrides) or of a scenario simulated with every record."""
    if where.is_dir():
        if overrides:
            raise click.UsageError(f"--set changes a scenario, and {where} is a result folder")
        from zerosim.results.compare import folder_run

        return folder_run(where)
    from zerosim.api import simulate

    loaded = _load(where, overrides)
    return simulate(loaded), loaded.to_dict()


SETTINGS_SHOWN = 20
"""Settings `zerosim diff` lists before it counts the rest (`--all-settings`)."""


@main.command()
@click.argument("result_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the figures (default: RESULT_DIR).")
@click.option("--format", "formats", multiple=True, type=click.Choice(["png", "svg", "pdf"]),
              help="Figure format, repeatable (default: png and svg).")
def plot(result_dir: Path, out_dir: Path | None, formats: tuple[str, ...]) -> None:
    """Redraw the figures of a finished run from its files (summary.json, *.csv)."""
    from zerosim.plots import save_all
    from zerosim.results import load_result

    _output_folder(out_dir or result_dir)
    written = save_all(load_result(result_dir), out_dir or result_dir,
                       formats=formats or ("png", "svg"))
    for path in written:
        click.echo(str(path))


@main.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("results") / "validation", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the cells as JSON.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Parallel workers for the groups of runs (default: one per CPU); 1 runs "
                   "every case in this process. The report is the same whatever the workers.")
def validate(out_dir: Path, as_json: bool, workers: int | None) -> None:
    """Compare simulated against every published measurement zerosim ships."""
    from zerosim.report import render_validation
    from zerosim.scenario import scenario_from_dict
    from zerosim.validation.reference import load_study
    from zerosim.validation.report import write_report
    from zerosim.validation.validate import cells_frame
    from zerosim.validation.validate import validate as run_validation

    _output_folder(out_dir)
    study = load_study()
    cells, results = run_validation(study, seed003=True, workers=workers)
    profile = scenario_from_dict(study.scenario_for(1), source="study").hardware
    write_report(cells, study, profile, out_dir, results)
    if as_json:
        _print_json(cells_frame(cells).to_dict(orient="records"))
    else:
        render_validation(cells, out_dir)




@main.command("fit-gemm")
@click.argument("table", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--profile", "profile_name", required=True, metavar="NAME|FILE",
              help="The GPU's profile (a shipped name or a YAML file): its peak, SMs, tiles "
                   "and HBM are kept, its GEMM values fitted.")
@click.option("--hold", "held", multiple=True, metavar="KEY",
              help="Keep this value (gemm_efficiency, gemm_k_overhead, gemm_latency_us or "
                   "gemm_memory_efficiency) at the profile's (repeatable): for a table that "
                   "cannot pin it, say one without small shapes for the latency. A value no "
                   "shape of the table is bound by is held without asking.")
@click.option("--launch-in-timing", is_flag=True,
              help="Each time is of one call between CUDA events on an idle GPU (PyTorch's "
                   "eager timing of a single matmul), so it holds the host launching the call: "
                   "fit that delay too, as a value of the measurement (printed, not a profile "
                   "value), and hold gemm_latency_us, which it adds to.")
def fit_gemm(table: Path, profile_name: str, held: tuple[str, ...],
             launch_in_timing: bool) -> None:
    """Fit gpu.gemm_efficiency, gpu.gemm_k_overhead, gpu.gemm_latency_us and
    gpu.gemm_memory_efficiency to TABLE, a CSV of measured GEMMs (columns m, n, k, TFLOPS and
    optionally batch: a cuBLAS or cuBLASLt benchmark of several shapes, large squares, a short K,
    small shapes and memory-bound ones among them) or the JSON the node probe writes
    (benchmarks/node_probe/probe_node.py: its GEMMs of sections g and h), and print the values
    to put in the profile."""
    from zerosim.hardware.profile import load_profile
    from zerosim.validation.gemm_rates import RATES, fit_gemm_rates, load_gemm_table

    measured = load_gemm_table(table)
    rows = measured.rows
    profile = load_profile(profile_name)
    if measured.launch_in_timing and not launch_in_timing:
        click.echo("the probe timed these GEMMs one call at a time: fitting the launch each "
                   "time holds (as --launch-in-timing)")
    fit = fit_gemm_rates(rows, profile, held, source=str(table),
                         launch_in_timing=launch_in_timing or measured.launch_in_timing)
    click.echo(f"{'shape':>24}  measured  modelled  error")
    for row, modelled in zip(rows, fit.modelled_tflops, strict=True):
        click.echo(f"{row.shape:>24}  {row.tflops:8.1f}  {modelled:8.1f}  "
                   f"{modelled / row.tflops - 1:+6.1%}")
    free = fit.free_keys
    pairs = [f"{a} / {b} {fit.correlations[i][j]:+.2f}" for i, a in enumerate(free)
             for j, b in enumerate(free) if i < j]
    click.echo(f"rms log error {fit.rms(rows):.1%} over {len(rows)} shapes"
               + (f"; correlations: {', '.join(pairs)}" if pairs else ""))
    for rate, spec in zip(fit.rates, RATES, strict=True):
        digits = spec.digits
        relative = not rate.held and round(rate.value, digits)
        note = ("held at the profile's value: no shape of the table is bound by it"
                if rate.unbound else "held at the profile's value: the launch in the "
                "table's times adds to it" if rate.beside_launch else
                "held at the profile's value" if rate.held else
                f"standard error {rate.std:.{digits}f} ({rate.rel_std:.0%})"
                if relative else f"standard error {rate.std:.{digits}f}")
        stderr = f"stderr_pct: {100 * rate.rel_std:.2g}, " if relative and rate.rel_std > 0 else ""
        click.echo(f"  {rate.key}: {{value: {rate.value:.{digits}f}, basis: "
                   f"{'assumed' if rate.held else 'fitted'}, {stderr}source: "
                   f'"zerosim fit-gemm {table.name}; {note}"}}')
    if fit.launch_delay:
        delay = fit.launch_delay
        click.echo(f"launch of each call in the table's times (a value of the measurement, not "
                   f"of the GPU): {delay.value:.2f} us, standard error {delay.std:.2f} "
                   f"({delay.rel_std:.0%})")


@main.command()
@click.argument("data", nargs=-1, required=True,
                type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--param", "params", multiple=True, metavar="[PROFILE:]KEY[=LOW:HIGH]",
              help="A value to fit, with bounds in its unit (default x/10..x*10): a profile key "
                   "(every profile), PROFILE:key (one testbed) or stack.key (the shared "
                   "software stack).")
@click.option("--only", "only", multiple=True, metavar="TEXT",
              help="Use only the rows whose scenario, phase or overrides contain TEXT "
                   "(repeat: every TEXT), e.g. --only 9.14b-dp4 --only forward.")
@click.option("--holdout", multiple=True, metavar="TEXT",
              help="Fit without the rows whose scenario, phase or overrides contain TEXT "
                   "(repeat: any TEXT; A&B: both, e.g. 9.14b-dp4&forward); report the "
                   "prediction error on them.")
@click.option("--suffix", default="-fitted", show_default=True,
              help="Appended to each fitted profile's and stack's name.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("results") / "calibration", show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes for the simulations (default: CPU count).")
@click.option("--max-iterations", type=click.IntRange(min=1), default=25, show_default=True)
def calibrate(data: tuple[Path, ...], params: tuple[str, ...], only: tuple[str, ...],
              holdout: tuple[str, ...], suffix: str, out_dir: Path, workers: int | None,
              max_iterations: int) -> None:
    """Fit profile and stack values to measured phase times (CSV files: scenario, overrides,
    phase, seconds; several testbeds at once) and write the fitted profiles and stack, the
    residuals and what the data identifies."""
    from concurrent.futures import ProcessPoolExecutor

    from zerosim.interrupts import ignore_interrupts_in_worker
    from zerosim.report import render_calibration
    from zerosim.validation.calibrate import calibrate as run_calibration
    from zerosim.validation.calibrate import write_outputs

    _output_folder(out_dir)
    workers = workers or os.cpu_count() or 1
    pool = (ProcessPoolExecutor(workers, initializer=ignore_interrupts_in_worker)
            if workers > 1 else None)
    try:
        result, bases = run_calibration(
            list(data), params, only=only, holdout=holdout, max_iterations=max_iterations,
            pool=pool,
            progress=lambda i, cost: click.echo(f"evaluation {i}: sum of squared log errors "
                                                f"{cost:.4f}", err=True))
    finally:
        if pool is not None:
            pool.shutdown()
    rows = f" (the rows with {', '.join(only)})" if only else ""
    paths = write_outputs(result, bases, " + ".join(p.name for p in data) + rows, out_dir,
                          suffix)
    render_calibration(result, paths)


@main.command()
@click.option("--total-params", type=float, help="Total parameters (e.g. 2851e6).")
@click.option("--largest-layer-params", type=float,
              help="Parameters of the largest layer (ZeRO-3 only).")
@click.option("--model", "model_name",
              help="Catalog model name (or its Hub repository) instead of the two counts.")
@click.option("--hf-config", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="A Hugging Face config.json instead of the two counts.")
@click.option("--scenario", "scenario_path", type=click.Path(dir_okay=False, path_type=Path),
              help="A scenario: its model, and its stage, GPUs and DeepSpeed version unless "
                   "given.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), help="[default: 1]")
@click.option("--nodes", type=click.IntRange(min=1), help="[default: 1]")
@click.option("--stage", type=click.Choice(["0", "1", "2", "3"]),
              help="ZeRO stage; 0 is plain data parallelism.  [default: 3]")
@click.option("--buffer-factor", type=float, default=1.5, show_default=True,
              help="DeepSpeed's additional_buffer_factor for host memory.")
@click.option("--deepspeed-version",
              help="ZeRO-2 without offload changed formula in DeepSpeed 0.14.3.  "
                   "[default: 0.13.3]")
@click.option("--sequence-length", type=click.IntRange(min=1), help=SEQUENCE_HELP)
@click.option("--framework", help=FRAMEWORK_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def estimate(total_params, largest_layer_params, model_name, hf_config, scenario_path,
             gpus_per_node, nodes, stage, buffer_factor, deepspeed_version, sequence_length,
             framework, as_json) -> None:
    """Memory needed for model states, as DeepSpeed's estimate_zero*_model_states_mem_needs;
    with --model, --hf-config or --scenario also the model's parameters, per-module breakdown
    and FLOPs per token."""
    from zerosim.estimate import (
        cluster_of,
        estimate_for_spec,
        estimate_model_states,
        zero2_rule_for,
    )
    from zerosim.models.catalog import require_catalog_model
    from zerosim.scenario.version import format_version, parse_version

    sources = [given for given in (model_name, hf_config, scenario_path, total_params)
               if given is not None]
    if len(sources) != 1:
        raise click.UsageError("give one of --model, --hf-config, --scenario or --total-params")
    spec, defaults, recipe = None, (3, 1, 1, "0.13.3", DEFAULT_SEQUENCE), None
    if framework is not None and (scenario_path is not None or total_params is not None):
        raise click.UsageError("--framework goes with --model or --hf-config")
    if framework is not None:
        recipe = _stack_recipe(framework)
    loaded = None
    if scenario_path is not None:
        loaded = _load(scenario_path, ())
        spec, recipe = loaded.model, loaded.stack.recipe
        defaults = (*cluster_of(loaded), format_version(loaded.runtime.deepspeed_version),
                    loaded.sequence_length)
    elif hf_config is not None:
        spec = _hf_spec(hf_config, "--hf-config")
    elif model_name is not None:
        spec = require_catalog_model(model_name, source=None, key_path="--model")
    stage, gpus_per_node, nodes, deepspeed_version, sequence_length = (
        default if given is None else given for given, default in zip(
            (stage, gpus_per_node, nodes, deepspeed_version, sequence_length), defaults,
            strict=True))
    note = "" if loaded is None else _mics_estimate_note(loaded, gpus_per_node * nodes)
    rule = zero2_rule_for(_with_warnings(lambda: parse_version(
        deepspeed_version, source="zerosim estimate", key_path="--deepspeed-version")))
    if spec is not None:
        if largest_layer_params is not None:
            raise click.UsageError("--largest-layer-params goes with --total-params")
        result = estimate_for_spec(spec, stage=int(stage), num_gpus_per_node=gpus_per_node,
                                   num_nodes=nodes, additional_buffer_factor=buffer_factor,
                                   zero2_rule=rule, recipe=recipe)
    else:
        result = estimate_model_states(
            stage=int(stage), total_params=total_params,
            largest_layer_params=largest_layer_params,
            num_gpus_per_node=gpus_per_node, num_nodes=nodes,
            additional_buffer_factor=buffer_factor, zero2_rule=rule)
    summary = (None if spec is None or model_name
               else _model_summary(spec, sequence_length, recipe))
    if as_json:
        _print_json({**result.to_dict(), **({"model": summary.to_dict()} if summary else {}),
                     **({"note": note} if note else {})})
    else:
        if summary:
            click.echo(summary.to_text() + "\n")
        click.echo(result.to_text())
        if note:
            click.echo(note)


def _mics_estimate_note(scenario: Scenario, gpus: int) -> str:
    """What DeepSpeed's estimator does not know of a MiCS scenario: a rank partitions over its
    shard group, not the estimate's `gpus` ('' without MiCS, or where they are the group)."""
    ds = scenario.deepspeed
    if not ds.mics.acts(ds.stage) or ds.mics.shard_size == gpus:
        return ""
    size, per_node = ds.mics.shard_size, scenario.ranks_on_fullest_node
    cluster = (f"--gpus-per-node {size} --nodes 1" if size <= per_node
               else f"--gpus-per-node {per_node} --nodes {size // per_node}")
    return (f"MiCS: each rank partitions its model states over its shard group of {size} "
            f"ranks, not the {gpus} above (DeepSpeed's estimator knows "
            f"nothing of MiCS): its GPU holds what the estimator gives for {size} GPUs "
            f"({cluster})")


@main.command()
@click.argument("sweep_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the results (default: results/sweeps/<sweep file stem>).")
@click.option("--workers", type=click.IntRange(min=1),
              help="Parallel workers (default: one per CPU); 1 runs the points in this process.")
@click.option("--dask", metavar="local|ADDRESS",
              help="Run on Dask: 'local' starts a LocalCluster, or a scheduler address "
                   "(tcp://host:8786). Needs pip install 'zerosim[dask]'.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override for every point, e.g. runtime.deepspeed_version=0.19.5.")
@click.option("--plots", is_flag=True,
              help="Draw iteration time, TFLOPS and peak HBM against the first axes (PNG).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--explain", is_flag=True,
              help="Also say what each phase waited on (its critical path, as run prints it): "
                   "waits_on.<phase> columns, and waits_on.other_ranks, the path's seconds "
                   "on other ranks' ops; a quarter to a third more time a point.")
def sweep(sweep_file: Path, out_dir: Path | None, workers: int | None, dask: str | None,
          overrides: tuple[str, ...], plots: bool, no_progress: bool, explain: bool) -> None:
    """Simulate every point of a what-if sweep; run it again to resume after a kill."""
    from zerosim.sweep import default_out_dir as sweep_out_dir
    from zerosim.sweep import run_sweep, write_plots
    from zerosim.sweep.report import render_outcome

    target = out_dir or sweep_out_dir(sweep_file)
    _output_folder(target)
    _on_interrupt(f"finished points are in {target / 'results.csv'}; run the same command "
                  "again to resume")
    outcome = run_sweep(sweep_file, out_dir=out_dir, workers=workers, dask=dask,
                        overrides=overrides, progress=not no_progress, explain=explain)
    render_outcome(outcome)
    if plots:
        written, problem = write_plots(outcome)
        for path in written:
            click.echo(f"plot: {path}")
        if problem:
            click.echo(problem, err=True)
    if outcome.not_run:
        sys.exit(EXIT_POINTS_NOT_RUN)


@main.command()
@scenario_argument
@click.option("--free", multiple=True, type=click.Choice(KNOBS),
              help="Also search this knob (repeatable; what_if, master, liger and "
                   "sequence_parallel are fixed by default).")
@click.option("--fix", multiple=True, type=click.Choice(KNOBS),
              help="Keep the scenario's value of this knob (repeatable).")
@click.option("--workers", type=click.IntRange(min=1),
              help="Parallel workers (default: one per CPU); 1 runs in this process.")
@click.option("--dask", metavar="local|ADDRESS", help="Run the points on Dask, as sweep does.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for tune.csv and the fastest configuration as fastest.yaml and "
                   "fastest_ds_config.json (default: results/tune/<scenario name>).")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Rows of the ranked table to print.")
def tune(scenario: Path, overrides: tuple[str, ...], free: tuple[str, ...],
         fix: tuple[str, ...], workers: int | None, dask: str | None, out_dir: Path | None,
         top: int) -> None:
    """The fastest configuration of SCENARIO that fits: search ZeRO stage, offload,
    micro-batch size for the same global batch, bucket and sub-group sizes, Twin-Flow; write
    the fastest as a scenario to run and its ds_config."""
    from zerosim.report import render_tune
    from zerosim.scenario.loader import parse_overrides
    from zerosim.tune import tune as run_tune

    loaded = _load(scenario, overrides)
    folder = _output_folder(out_dir or Path("results") / "tune" / loaded.name)
    outcome = _without_scenario_warnings(lambda: run_tune(
        scenario, overrides=parse_overrides(overrides), free=free, fix=fix, workers=workers,
        dask=dask, out_dir=folder))
    best = outcome.best
    render_tune(outcome, top=top, best_path=None if best is None else _without_scenario_warnings(
        lambda: _best_path(scenario, best["overrides"])))


def _best_path(scenario: Path, overrides: dict) -> RankPath | None:
    """The fastest configuration simulated once more with every record: what each phase of
    its reported rank waits on."""
    from zerosim.api import simulate

    return _critical_totals(simulate(scenario, overrides=overrides))


@main.command(epilog="Exit status: 0 ok, 2 bad input, 3 the scenario does not fit (oom).")
@scenario_argument
@click.option("--step", type=click.FloatRange(min=0, max=0.5, min_open=True),
              default=0.1, show_default=True,
              help="Relative step: each value is tried at x(1 - step) and x(1 + step).")
@click.option("--key", "keys", multiple=True, metavar="KEY",
              help="Only this value (repeatable), as --set names it: "
                   "hardware.pcie.h2d_pinned_GBps, stack.host.fetch_hook_us.")
@click.option("--all", "everything", is_flag=True,
              help="List every value, those that move the iteration by less than 0.005 per 1% "
                   "too.")
@table_options("sensitivity.csv", "results/sensitivity/<scenario name>")
@click.option("--plots", is_flag=True,
              help="Also draw sensitivity.png (the iteration) and one PNG per phase.")
def sensitivity(scenario: Path, overrides: tuple[str, ...], step: float, keys: tuple[str, ...],
                everything: bool, workers: int | None, out_dir: Path | None, no_files: bool,
                as_json: bool, plots: bool) -> None:
    """Which hardware and stack values SCENARIO's prediction hangs on: each moved by --step
    both ways, one at a time, and the elasticity of the iteration and of each phase (the %
    a 1% error in the value moves the time), ranked, beside the value's basis; then each
    alternative reading of the profile's data run whole (alternatives.csv)."""
    from zerosim.report import render_sensitivity
    from zerosim.scenario.loader import parse_overrides
    from zerosim.sensitivity import DoesNotFit
    from zerosim.sensitivity import sensitivity as run_sensitivity

    _files_needed(no_files, plots)
    _files_needed(no_files, out_dir is not None, "--out")
    loaded = _load(scenario, overrides)
    folder = None if no_files else _output_folder(
        out_dir or Path("results") / "sensitivity" / loaded.name)
    try:
        outcome = _without_scenario_warnings(lambda: run_sensitivity(
            scenario, overrides=parse_overrides(overrides), step=step, keys=keys,
            workers=workers, out_dir=folder))
    except DoesNotFit as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(EXIT_OOM)
    if plots:
        from zerosim.sensitivity import write_charts

        outcome.files += write_charts(outcome, folder)
    if as_json:
        _print_json({"scenario": outcome.scenario_name, "hardware": outcome.hardware,
                     "step": outcome.step, "base_s": outcome.base,
                     "against_physics": [r.key for r in outcome.against_physics()],
                     "rows": [r.as_row() for r in outcome.ranked(everything=everything)],
                     "alternatives": [r.as_row(outcome.base) for r in outcome.alternatives]})
        return
    render_sensitivity(outcome, everything=everything)


@main.command(epilog="Exit status: 0 every row read and every configuration simulated (one "
                     "that does not fit is a row with status oom), 1 some refused (status "
                     "refused: a bad value, or a configuration zerosim does not replay; the "
                     "line names the row and the column) or not simulated (status error), 2 "
                     "bad input (the table's header, --hardware, a --set, or no row zerosim "
                     "replays).")
@click.argument("runs_table", metavar="RUNS.csv",
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("--hardware", required=True, metavar="NAME|FILE",
              help="The hardware profile the runs ran on: a built-in name or a profile YAML "
                   "(runs with more GPUs than a node holds spread over its nodes).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a value of every run's scenario, as run --set does, e.g. "
                   "what_if.buffer_boundary_grads=true or hardware.pcie.h2d_pinned_GBps=50.")
@table_options("predictions.csv", "results/predict/<table>-<hardware>")
@click.option("--plots", is_flag=True,
              help="Also draw predictions.png: predicted against measured, per time.")
@click.option("--explain", is_flag=True,
              help="Also say what each phase waited on (its critical path, as run prints it): "
                   "the waits_on_<phase> and waits_on_other_ranks columns of "
                   "predictions.csv and --json.")
@click.option("--alternatives", is_flag=True,
              help="Also predict the table at each alternative reading of the profile's data "
                   "(its alternatives, hardware.alternative=NAME): the iteration at each, each "
                   "reading's rms error where the table has measurements, alternatives.csv.")
def predict(runs_table: Path, hardware: str, overrides: tuple[str, ...], workers: int | None,
            out_dir: Path | None, no_files: bool, as_json: bool, plots: bool,
            explain: bool, alternatives: bool) -> None:
    """Predict a table of measured runs in the Deep Optimizer States artifact format (the
    columns of zerosim/validation/data/polaris_zero3_offload_runs.csv): each distinct
    configuration simulated on --hardware, per optimizer step, beside its runs' mean
    measurements where the table has them."""
    from zerosim.hardware.profile import load_profile
    from zerosim.report import render_alternative_predictions, render_predictions
    from zerosim.runs import (
        RefusedRow,
        off_repeat_rows,
        outcome_rows,
        predict_alternatives,
        prediction_row,
        read_runs,
        rms_row,
        run_to_run_sd_row,
        write_alternative_predictions,
        write_predictions,
    )
    from zerosim.runs import predict as run_predict
    from zerosim.scenario.loader import parse_overrides
    from zerosim.series import accumulation_series, series_rows, write_series

    _files_needed(no_files, plots)
    _files_needed(no_files, out_dir is not None, "--out")
    refused: list[RefusedRow] = []
    runs = _with_warnings(lambda: read_runs(runs_table, refused))
    load_profile(hardware)
    folder = None if no_files else _output_folder(out_dir or Path("results") / "predict" / (
        f"{runs_table.stem}-{Path(hardware).stem}"))
    outcome = run_predict(runs, hardware, overrides=parse_overrides(overrides),
                          workers=workers, source=str(runs_table), explain=explain,
                          refused_rows=refused)
    readings = predict_alternatives(runs, hardware, overrides=parse_overrides(overrides),
                                    workers=workers, source=str(runs_table)) if alternatives else []
    series = accumulation_series(outcome.predictions)
    if folder is not None:
        outcome.files = [write_predictions(outcome, folder / "predictions.csv"),
                         write_series(series, folder / "series.csv")]
        if readings:
            outcome.files.append(write_alternative_predictions(
                readings, folder / "alternatives.csv"))
        if plots:
            from zerosim.plots import predicted_vs_measured, save_figure

            outcome.files.append(save_figure(predicted_vs_measured(
                outcome.points(), outcome.title), folder / "predictions.png", dpi=110))
    if as_json:
        _print_json({"table": str(runs_table), "hardware": hardware,
                     "rows": outcome_rows(outcome),
                     "series": series_rows(series),
                     "run_to_run_sd": run_to_run_sd_row(outcome),
                     "off_repeats": off_repeat_rows(outcome),
                     **({"alternatives": [
                         {"alternative": r.name, "sets": r.sets, "rms": rms_row(r.outcome),
                          "rows": [prediction_row(p) for p in r.outcome.predictions]}
                         for r in readings]} if alternatives else {})})
    else:
        render_predictions(outcome, series)
        if readings:
            render_alternative_predictions(outcome, readings)
    if not outcome.complete:
        sys.exit(EXIT_POINTS_NOT_RUN)


if __name__ == "__main__":
    main()
