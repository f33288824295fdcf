"""A run is the same to the bit whichever Python runs it. From Python 3.12, `sum` compensates
the rounding of floats, which moved three of the fingerprint cases' results in their last bits
against 3.11; zerosim adds floats with `units.ordered_sum` instead. Here `sum` is made to add
floats one way and then the other while those three cases run (their phases, memory and
records through `zerosim.simulate`), and `zerosim predict`'s figures of the measured Polaris
runs: nothing may change; and every `sum` zerosim calls on the way through the commands is
watched: none may be handed a float."""

from __future__ import annotations

import builtins
import math
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest

import zerosim
from zerosim.results.compare import compare
from zerosim.runs import QUANTITIES, configurations, run_to_run_sd
from zerosim.series import fit_line
from zerosim.tune import tune
from zerosim.units import ordered_sum
from zerosim.validation.polaris import load_runs

ROOT = Path(__file__).resolve().parent.parent
BUILTIN_SUM = builtins.sum
CASES = {"seed003-50b": ROOT / "scenarios" / "seed003" / "roberta50b_p4d64.yaml",
         "polaris-5.90b-dp4": ROOT / "scenarios" / "calibration" / "polaris"
         / "polaris-5.90b-dp4-mb4-ga1-sg1e08.yaml",
         "polaris-dos-gap3": ROOT / "scenarios" / "polaris_dos.yaml"}


def _floats(items: list, start) -> bool:
    return (any(type(x) is float for x in (*items, start))
            and all(type(x) in (int, float, bool) for x in (*items, start)))


def added_in_order(iterable, /, start=0):
    """`sum`, floats added one after another (Python 3.11's)."""
    items = list(iterable)
    return ordered_sum(items, start) if _floats(items, start) else BUILTIN_SUM(items, start)


def added_exactly(iterable, /, start=0):
    """`sum`, floats added exactly rounded (what a compensated sum, Python 3.12's, gives
    where the two differ)."""
    items = list(iterable)
    return math.fsum([start, *items]) if _floats(items, start) else BUILTIN_SUM(items, start)


def test_the_two_ways_of_adding_differ():
    values = [0.1] * 10
    assert added_in_order(values) == 0.9999999999999999 and added_exactly(values) == 1.0


def _outcome(path: Path) -> tuple:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = zerosim.simulate(path)
    return (result.summary, result.spans.to_dict("list"), result.memory.to_dict("list"),
            result.links.to_dict("list"))


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_does_not_hang_on_how_python_adds_floats(case, monkeypatch):
    monkeypatch.setattr(builtins, "sum", added_in_order)
    in_order = _outcome(CASES[case])
    monkeypatch.setattr(builtins, "sum", added_exactly)
    assert _outcome(CASES[case]) == in_order


def test_the_measured_tables_figures_do_not_hang_on_how_python_adds_floats(monkeypatch):
    """`zerosim predict`'s means, spreads and pooled run-to-run deviation of the shipped Polaris
    runs, and the accumulation series' lines."""
    def figures() -> list:
        shipped = configurations(load_runs())
        out = [run_to_run_sd(shipped, quantity) for quantity in QUANTITIES]
        for configuration in shipped:
            out += [(configuration.measured(q), configuration.spread(q),
                     configuration.deviations(q)) for q in QUANTITIES]
        xs, ys = [1.0, 2.0, 4.0, 8.0, 16.0], [0.1, 0.7, 1.3, 2.9, 6.1]
        return [*out, fit_line(xs, ys)]

    monkeypatch.setattr(builtins, "sum", added_in_order)
    in_order = figures()
    monkeypatch.setattr(builtins, "sum", added_exactly)
    assert figures() == in_order


PACKAGE = str(Path(zerosim.__file__).parent)


def test_no_float_total_of_zerosim_goes_through_sum(monkeypatch, toy_file, tmp_path):
    """Every `sum` zerosim's own code calls while it runs the three cases with every record
    (their critical paths and a comparison of two of them), prints a run and a comparison,
    tunes the toy and writes its files, and computes predict's figures is watched: none may be
    handed a float (a float total that goes through `sum` moves with the Python version)."""
    from click.testing import CliRunner

    from zerosim.cli import main

    handed: Counter[str] = Counter()

    def watched(iterable, /, start=0):
        items = list(iterable)
        caller = sys._getframe(1).f_code.co_filename
        if caller.startswith(PACKAGE) and any(type(x) is float for x in (*items, start)):
            handed[f"{caller[len(PACKAGE) + 1:]}:{sys._getframe(1).f_lineno}"] += 1
        return BUILTIN_SUM(items, start)

    monkeypatch.setattr(builtins, "sum", watched)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = [zerosim.simulate(path) for path in CASES.values()]
        for result in results:
            assert not result.critical_path.empty
        compare(results[1], results[2])
        runner = CliRunner()
        for args in (["run", str(CASES["polaris-5.90b-dp4"]), "--no-files", "--explain"],
                     ["diff", str(CASES["polaris-5.90b-dp4"]), "--set",
                      "deepspeed.zero_optimization.reduce_bucket_size=2e8"]):
            assert runner.invoke(main, args).exit_code == 0
        tune(toy_file, fix=["reduce_bucket_size", "sub_group_size", "ratio"], workers=1,
             out_dir=tmp_path / "tuned")
    shipped = configurations(load_runs())
    for quantity in QUANTITIES:
        run_to_run_sd(shipped, quantity)
        for configuration in shipped:
            configuration.spread(quantity)
    fit_line([1.0, 2.0, 4.0], [0.1, 0.7, 1.3])
    assert dict(handed) == {}
