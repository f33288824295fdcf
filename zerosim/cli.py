"""Command line: parsing and printing only; the work happens in the library."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from zerosim.errors import ZerosimError
from zerosim.tune import KNOBS

SET_HELP = "Override a scenario value by dotted path, e.g. deepspeed.zero_optimization.stage=2."


class _ZerosimGroup(click.Group):
    """Turns zerosim's own errors into one clear line and exit status 2, without a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ZerosimError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(2)


@click.group(cls=_ZerosimGroup)
@click.version_option(package_name="zerosim")
def main() -> None:
    """zerosim: replay a DeepSpeed ZeRO offloaded training iteration on a hardware model."""


def _print_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def scenario_argument(func):
    """The SCENARIO argument and repeatable --set, shared by every command that takes one."""
    func = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                        help=SET_HELP)(func)
    return click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))(func)


def _load(scenario: Path, overrides: tuple[str, ...]):
    """Load a scenario, showing the unmodelled-keys warning once on stderr."""
    import warnings

    from zerosim.scenario import UnmodelledKeysWarning, load_scenario

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnmodelledKeysWarning)
        loaded = load_scenario(scenario, overrides)
    for warning in caught:
        click.echo(f"warning: {warning.message}", err=True)
    return loaded


@main.command()
@scenario_argument
@click.option("--json", "as_json", is_flag=True, help="Print the resolved scenario as JSON.")
def check(scenario: Path, overrides: tuple[str, ...], as_json: bool) -> None:
    """Validate a scenario and print it with every default filled in."""
    from zerosim.report import render_scenario

    loaded = _load(scenario, overrides)
    if as_json:
        _print_json(loaded.to_dict())
    else:
        render_scenario(loaded)


def default_out_dir(name: str) -> Path:
    return Path("results") / name


@main.command()
@scenario_argument
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the output files (default: results/<scenario name>).")
@click.option("--no-files", is_flag=True, help="Only print the summary; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--plots", is_flag=True,
              help="Also draw the timeline, memory, PCIe and phase figures (PNG and SVG).")
def run(scenario: Path, overrides: tuple[str, ...], out_dir: Path | None, no_files: bool,
        as_json: bool, plots: bool) -> None:
    """Simulate one training iteration and write its timeline, memory curves and trace."""
    import time

    from zerosim.api import simulate, simulate_summary
    from zerosim.report import render_summary

    if plots and no_files:
        raise click.UsageError("--plots writes files; drop --no-files")
    loaded = _load(scenario, overrides)
    started = time.perf_counter()
    target = None
    if no_files:  # the summary alone: no tables to build
        summary = simulate_summary(loaded)
        wall = time.perf_counter() - started
    else:
        from zerosim.results.export import write_outputs

        result = simulate(loaded)
        wall = time.perf_counter() - started
        summary = result.summary
        target = out_dir or default_out_dir(loaded.name)
        write_outputs(result, target, extra={"scenario.json": loaded.to_dict()})
        if plots:
            from zerosim.plots import save_all

            save_all(result, target)
    if as_json:
        _print_json(summary)
    else:
        render_summary(summary, wall_s=wall, out_dir=target)


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

    written = save_all(load_result(result_dir), out_dir or result_dir,
                       formats=formats or ("png", "svg"))
    for path in written:
        click.echo(str(path))


@main.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("results") / "validation", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the cells as JSON.")
def validate(out_dir: Path, as_json: bool) -> None:
    """Compare simulated against every published measurement zerosim ships."""
    from zerosim.report import render_validation
    from zerosim.scenario import scenario_from_dict
    from zerosim.validation.reference import load_study
    from zerosim.validation.report import write_report
    from zerosim.validation.validate import cells_frame
    from zerosim.validation.validate import validate as run_validation

    study = load_study()
    cells, _ = run_validation(study, seed003=True)
    profile = scenario_from_dict(study.scenario_for(1), source="study").hardware
    write_report(cells, study, profile, out_dir)
    if as_json:
        _print_json(cells_frame(cells).to_dict(orient="records"))
    else:
        render_validation(cells, out_dir)


@main.command()
@click.argument("data", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--param", "params", multiple=True, metavar="KEY[=LOW:HIGH]",
              help="A profile value to fit, with bounds in its unit (default x/10..x*10).")
@click.option("--holdout", metavar="TEXT",
              help="Fit without the rows whose scenario or overrides contain TEXT; report "
                   "the prediction error on them.")
@click.option("--name", help="Name of the fitted profile (default: <profile>-fitted).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("results") / "calibration", show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes for the simulations (default: CPU count).")
@click.option("--max-iterations", type=click.IntRange(min=1), default=25, show_default=True)
def calibrate(data: Path, params: tuple[str, ...], holdout: str | None, name: str | None,
              out_dir: Path, workers: int | None, max_iterations: int) -> None:
    """Fit hardware-profile values to measured phase times (CSV: scenario, overrides, phase,
    seconds) and write the fitted profile and the residuals."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    from zerosim.report import render_calibration
    from zerosim.validation.calibrate import calibrate as run_calibration
    from zerosim.validation.calibrate import write_outputs

    workers = workers or os.cpu_count() or 1
    pool = ProcessPoolExecutor(workers) if workers > 1 else None
    try:
        result, tree, base = run_calibration(
            data, params, holdout=holdout, max_iterations=max_iterations, pool=pool,
            progress=lambda i, cost: click.echo(f"iteration {i}: sum of squared log errors "
                                                f"{cost:.4f}", err=True))
    finally:
        if pool is not None:
            pool.shutdown()
    paths = write_outputs(result, tree, data, out_dir, name or f"{base}-fitted")
    render_calibration(result, paths)


@main.command()
@click.option("--total-params", type=float, help="Total parameters (e.g. 2851e6).")
@click.option("--largest-layer-params", type=float,
              help="Parameters of the largest layer (ZeRO-3 only).")
@click.option("--model", "model_name", help="Catalog model name instead of the two counts.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--stage", type=click.Choice(["0", "1", "2", "3"]), default="3", show_default=True,
              help="ZeRO stage; 0 is plain data parallelism.")
@click.option("--buffer-factor", type=float, default=1.5, show_default=True,
              help="DeepSpeed's additional_buffer_factor for host memory.")
@click.option("--deepspeed-version", default="0.13.3", show_default=True,
              help="ZeRO-2 without offload changed formula in DeepSpeed 0.14.3.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def estimate(total_params, largest_layer_params, model_name, gpus_per_node, nodes, stage,
             buffer_factor, deepspeed_version, as_json) -> None:
    """Memory needed for model states, as DeepSpeed's estimate_zero*_model_states_mem_needs."""
    from zerosim.estimate import estimate_for_model, estimate_model_states, zero2_rule_for
    from zerosim.scenario.version import parse_version

    rule = zero2_rule_for(parse_version(deepspeed_version, source="--deepspeed-version",
                                        key_path="--deepspeed-version"))

    if model_name is not None:
        if total_params is not None or largest_layer_params is not None:
            raise click.UsageError("give either --model or --total-params, not both")
        result = estimate_for_model(model_name, stage=int(stage), num_gpus_per_node=gpus_per_node,
                                    num_nodes=nodes, additional_buffer_factor=buffer_factor,
                                    zero2_rule=rule)
    else:
        if total_params is None:
            raise click.UsageError("give --total-params (and --largest-layer-params) or --model")
        result = estimate_model_states(
            stage=int(stage), total_params=int(total_params),
            largest_layer_params=None if largest_layer_params is None
            else int(largest_layer_params),
            num_gpus_per_node=gpus_per_node, num_nodes=nodes,
            additional_buffer_factor=buffer_factor, zero2_rule=rule)
    if as_json:
        _print_json(result.to_dict())
    else:
        click.echo(result.to_text())


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
def sweep(sweep_file: Path, out_dir: Path | None, workers: int | None, dask: str | None,
          overrides: tuple[str, ...], plots: bool, no_progress: bool) -> None:
    """Simulate every point of a what-if sweep; run it again to resume after a kill."""
    from zerosim.sweep import default_out_dir as sweep_out_dir
    from zerosim.sweep import run_sweep, write_plots
    from zerosim.sweep.report import render_outcome

    try:
        outcome = run_sweep(sweep_file, out_dir=out_dir, workers=workers, dask=dask,
                            overrides=overrides, progress=not no_progress)
    except KeyboardInterrupt:
        target = out_dir or sweep_out_dir(sweep_file)
        click.echo(f"interrupted: finished points are in {target / 'results.csv'}; "
                   "run the same command again to resume", err=True)
        sys.exit(130)
    render_outcome(outcome)
    if plots:
        written, problem = write_plots(outcome)
        for path in written:
            click.echo(f"plot: {path}")
        if problem:
            click.echo(problem, err=True)
    if outcome.not_run:
        sys.exit(1)


@main.command()
@scenario_argument
@click.option("--free", multiple=True, type=click.Choice(KNOBS),
              help="Also search this knob (repeatable; what_if is fixed by default).")
@click.option("--fix", multiple=True, type=click.Choice(KNOBS),
              help="Keep the scenario's value of this knob (repeatable).")
@click.option("--workers", type=click.IntRange(min=1),
              help="Parallel workers (default: one per CPU); 1 runs in this process.")
@click.option("--dask", metavar="local|ADDRESS", help="Run the points on Dask, as sweep does.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for tune.csv (default: results/tune/<scenario name>).")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Rows of the ranked table to print.")
def tune(scenario: Path, overrides: tuple[str, ...], free: tuple[str, ...],
         fix: tuple[str, ...], workers: int | None, dask: str | None, out_dir: Path | None,
         top: int) -> None:
    """The fastest configuration of SCENARIO that fits: search ZeRO stage, offload,
    micro-batch size for the same global batch, bucket and sub-group sizes, Twin-Flow."""
    from zerosim.report import render_tune
    from zerosim.scenario.loader import parse_overrides
    from zerosim.tune import tune as run_tune

    loaded = _load(scenario, overrides)
    outcome = run_tune(scenario, overrides=parse_overrides(overrides), free=free, fix=fix,
                       workers=workers, dask=dask,
                       out_dir=out_dir or Path("results") / "tune" / loaded.name)
    render_tune(outcome, top=top)

if __name__ == "__main__":
    main()
