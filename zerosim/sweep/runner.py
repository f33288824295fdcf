"""Run a sweep's points on a `concurrent.futures` executor: in process, a local process pool,
or Dask (a LocalCluster or a scheduler's address), with the same submission code for all."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zerosim.errors import ZerosimError, clip
from zerosim.interrupts import ignore_interrupts_in_worker
from zerosim.results.critical import WAITS_ON
from zerosim.sweep.spec import Point, SweepSpec, load_sweep, validate
from zerosim.sweep.store import ResultStore, Resumed, locked
from zerosim.sweep.worker import run_point
from zerosim.vocabulary import Status

DEFAULT_ROOT = Path("results") / "sweeps"
POINTS_JSON = "points.json"
SPEC_COPY = "sweep.yaml"
WINDOW_PER_WORKER = 2   # points queued per worker: keeps workers busy, keeps a kill cheap


class DaskMissingError(ZerosimError):
    """--dask was asked for but dask.distributed is not installed."""


DASK_CONNECT_TIMEOUT_S = 10
"""How long a scheduler given by address may take to answer (Dask's own default is 30 s)."""


class DaskAddressError(ZerosimError):
    """--dask names a scheduler that cannot be used or reached."""


class SweepAborted(ZerosimError):
    """The executor broke (a worker process died); the rows written so far are kept."""


def default_out_dir(spec_path: str | Path) -> Path:
    return DEFAULT_ROOT / Path(spec_path).stem


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


@dataclass
class SweepOutcome:
    spec: SweepSpec
    out_dir: Path
    total: int                            # points in the sweep
    resumed: Resumed                      # what an earlier run had already written
    ran: int = 0                          # points run now
    counts: Counter = field(default_factory=Counter)   # status -> points, over the whole file
    not_run: list[tuple[Point, str]] = field(default_factory=list)  # executor failures
    wall_s: float = 0.0
    executor: str = ""
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def points_per_s(self) -> float:
        return self.ran / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def results_csv(self) -> Path:
        return self.out_dir / "results.csv"


# ------------------------------------------------------------------ executors


class InlineExecutor(Executor):
    """Runs each call at submission, in this process (`--workers 1`): no pool, plain tracebacks
    from the engine under a debugger."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as err:
            future.set_exception(err)
        return future


def _dask_client(client_type: Any, address: str) -> Any:
    """A client of the scheduler at `address`; an address it cannot use or reach is bad input
    (said in one line), not a crash."""
    try:
        return client_type(address, timeout=DASK_CONNECT_TIMEOUT_S)
    except (ValueError, TypeError, OSError) as err:
        raise DaskAddressError(
            f"--dask {clip(address, 120)}: expected 'local' or the address of a running Dask "
            f"scheduler (tcp://HOST:PORT), got {clip(str(err) or type(err).__name__, 200)}"
        ) from None


@contextlib.contextmanager
def open_executor(workers: int | None, dask: str | None, todo: int
                  ) -> Iterator[tuple[Executor, int, str]]:
    """(executor, points to keep in flight, a description) for the options of `zerosim sweep`."""
    if dask:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise DaskMissingError("--dask needs dask.distributed: pip install 'zerosim[dask]'"
                                   ) from None
        cluster = None
        if dask == "local":
            cluster = LocalCluster(n_workers=workers or cpu_count(), threads_per_worker=1,
                                   processes=True, dashboard_address=None)
            client = Client(cluster)
        else:
            client = _dask_client(Client, dask)
        try:
            slots = max(1, sum(client.nthreads().values()))
            where = "LocalCluster" if cluster is not None else dask
            yield (client.get_executor(), WINDOW_PER_WORKER * slots,
                   f"on dask {where} ({slots} workers)")
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
        return
    count = min(workers or cpu_count(), max(todo, 1))
    if count <= 1:
        yield InlineExecutor(), 1, "in process"
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    with ProcessPoolExecutor(count, mp_context=context,
                             initializer=ignore_interrupts_in_worker) as pool:
        yield pool, WINDOW_PER_WORKER * count, f"on {count} processes"


def drive(executor: Executor, window: int, base: str, todo: list[Point],
          on_row: Callable[[Point, Mapping[str, Any]], None],
          on_failure: Callable[[Point, BaseException], None], *, explain: bool = False
          ) -> None:
    """Keep up to `window` points in flight; hand each finished row to `on_row`."""
    pending = deque(todo)
    inflight: dict[Future, Point] = {}
    try:
        while pending or inflight:
            while pending and len(inflight) < window:
                point = pending.popleft()
                inflight[executor.submit(run_point, base, point.overrides, point.point_id,
                                         explain)] = point
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: inflight[f].index):
                point = inflight.pop(future)
                error = future.exception()
                if error is None:
                    on_row(point, future.result())
                elif isinstance(error, BrokenProcessPool):
                    raise SweepAborted(f"a worker process died while running point "
                                       f"{point.index} ({point.describe()}): {error}; the rows "
                                       "written so far are kept, run the sweep again to resume")
                else:
                    on_failure(point, error)
    finally:
        for future in inflight:
            future.cancel()


# ------------------------------------------------------------------ progress


class ProgressBar:
    """A rich progress bar on stderr: points done/total, failures, ETA (or nothing)."""

    def __init__(self, enabled: bool, title: str, total: int, done: int, counts: Counter):
        self.bar = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                            MofNCompleteColumn(),
                            TextColumn("{task.fields[oom]} oom, {task.fields[error]} error"),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                            console=Console(stderr=True), transient=False)
        self.task = self.bar.add_task(title, total=total, completed=done, oom=counts[Status.OOM],
                                      error=counts[Status.ERROR])

    def __enter__(self) -> ProgressBar:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def advance(self, counts: Counter) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, oom=counts[Status.OOM],
                            error=counts[Status.ERROR])

    def print(self, text: str) -> None:
        if self.bar is not None:
            self.bar.console.print(text, markup=False, highlight=False)


# ------------------------------------------------------------------ the sweep


def write_inputs(spec: SweepSpec, points: list[Point], out_dir: Path) -> list[Path]:
    """Copy the spec and the resolved points into the output folder."""
    from zerosim.results.folders import atomic_write

    document = {
        "sweep": spec.source,
        "base": str(spec.base),
        "set": spec.fixed,
        "axes": spec.axis_columns,
        "points": [{"index": p.index, "point_id": p.point_id, "values": p.values,
                    "overrides": p.overrides} for p in points],
    }
    spec_copy, points_json = out_dir / SPEC_COPY, out_dir / POINTS_JSON
    atomic_write(spec_copy, lambda h: h.write(spec.text))
    atomic_write(points_json,
                 lambda h: h.write(json.dumps(document, indent=1, default=str) + "\n"))
    return [spec_copy, points_json]


def run_sweep(spec_path: str | Path, *, out_dir: str | Path | None = None,
              workers: int | None = None, dask: str | None = None,
              overrides: Any = None, progress: bool = False,
              executor: Executor | None = None, explain: bool = False) -> SweepOutcome:
    """Run every point of a sweep not already in `out_dir`'s results.csv.

    Every point is validated first (a SweepError lists the bad axis values, and nothing is
    written). `workers=1` runs in this process, `None` uses one process per CPU; `dask` is
    "local" or a scheduler address. `executor` lends an executor you manage (tests, notebooks).
    `explain` adds what each phase waited on (`waits_on.<phase time>` columns) and runs again
    the points results.csv holds that ran without it.
    """
    spec = load_sweep(spec_path, overrides)
    points = spec.points()
    notes = validate(spec, points)
    target = Path(out_dir) if out_dir is not None else default_out_dir(spec.path)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        lent = None
        if executor is not None:
            lent = executor, WINDOW_PER_WORKER * (workers or cpu_count()), "on the given executor"
        elif dask:
            lent = stack.enter_context(open_executor(workers, dask, len(points)))
        target.mkdir(parents=True, exist_ok=True)
        return _run_in(spec, points, notes, target, started, workers=workers, lent=lent,
                       progress=progress, explain=explain)


def _run_in(spec: SweepSpec, points: list[Point], notes: list[str], target: Path,
            started: float, *, workers: int | None,
            lent: tuple[Executor, int, str] | None, progress: bool,
            explain: bool = False) -> SweepOutcome:
    """The sweep's points in `target`: what results.csv already holds is kept (it is read,
    and refused if it is not a sweep's, before anything is written), the rest is run; with
    `explain`, a kept point that ran without it (`explained`) is run again."""
    with locked(target):
        store = ResultStore(target, spec.axis_columns)
        resumed = store.resume(points)
        files = write_inputs(spec, points, target)
        todo = [p for p in points if p.point_id not in store.rows
                or (explain and not explained(store.rows[p.point_id]))]
        outcome = SweepOutcome(spec, target, len(points), resumed, notes=notes)
        outcome.counts.update(r["status"] for r in store.rows.values())
        try:
            if todo:
                _run_points(spec, todo, store, outcome, workers=workers, lent=lent,
                            progress=progress, explain=explain)
        except KeyboardInterrupt:
            outcome.notes.append(f"interrupted: {len(store.rows)} of {len(points)} points are "
                                 f"in {store.results_path}; run the same command to resume")
            raise
        finally:
            outcome.files = files + store.finish()
            outcome.wall_s = time.perf_counter() - started
    return outcome


def _run_points(spec: SweepSpec, todo: list[Point], store: ResultStore,
                outcome: SweepOutcome, *, workers: int | None,
                lent: tuple[Executor, int, str] | None, progress: bool,
                explain: bool = False) -> None:
    """`lent`: (executor, points in flight, description) opened by the caller (a Dask client,
    an executor the user manages); else a local pool sized for `todo`."""
    with contextlib.ExitStack() as stack:
        executor, window, outcome.executor = lent or stack.enter_context(
            open_executor(workers, None, len(todo)))
        bar = stack.enter_context(ProgressBar(progress, spec.name, outcome.total,
                                            outcome.total - len(todo), outcome.counts))

        def on_row(point: Point, row: Mapping[str, Any]) -> None:
            written = store.add(point, row)
            outcome.ran += 1
            outcome.counts[written["status"]] += 1
            bar.advance(outcome.counts)

        def on_failure(point: Point, error: BaseException) -> None:
            outcome.not_run.append((point, f"{type(error).__name__}: {error}"))

        drive(executor, window, str(spec.base), todo, on_row, on_failure, explain=explain)


# ------------------------------------------------------------------ plots

PLOT_METRICS = ("iteration_s", "tokens_per_s", "tflops_per_gpu", "peak_hbm_GiB")


def explained(row: Mapping[str, str]) -> bool:
    """Whether a results.csv row says what its phases waited on: one that ran with
    `--explain`, or one with nothing to explain (a point that did not fit or failed)."""
    return row.get("status") != Status.OK or any(
        value for key, value in row.items() if key.startswith(f"{WAITS_ON}."))


def write_plots(outcome: SweepOutcome) -> tuple[list[Path], str | None]:
    """PNGs of the main metrics against the first one or two axes, with `zerosim.plots`.

    Returns the files and, when plots could not be drawn, why.
    """
    try:
        from zerosim import plots
    except ImportError:
        return [], "plots are not available (zerosim.plots is missing)"
    metric_plot = getattr(plots, "sweep_metric", None)
    heatmap = getattr(plots, "sweep_heatmap", None)
    if metric_plot is None:
        return [], "plots are not available (zerosim.plots has no sweep_metric)"
    import pandas as pd

    frame = pd.read_csv(outcome.results_csv)
    axes = [a for a in outcome.spec.plot_axes if a in frame and frame[a].nunique() > 1][:2]
    if not axes:
        return [], "nothing to plot: no axis takes more than one value"
    written: list[Path] = []
    try:
        for metric in PLOT_METRICS:
            if metric not in frame:
                continue
            hue = axes[1] if len(axes) > 1 else None
            figures = [(f"{metric}_vs_{outcome.spec.axis_labels[axes[0]]}.png",
                        lambda m=metric, h=hue: metric_plot(frame, x=axes[0], metric=m, hue=h))]
            if hue is not None and heatmap is not None:
                figures.append((f"{metric}_heatmap.png",
                                lambda m=metric: heatmap(frame, x=axes[0], y=axes[1], metric=m)))
            for name, draw in figures:
                written.append(plots.save_figure(draw(), outcome.out_dir / name, dpi=120,
                                                 bbox_inches="tight"))
    except Exception as err:
        return written, f"plotting failed: {type(err).__name__}: {err}"
    return written, None
