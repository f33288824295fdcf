"""The pure layers load without the engine (SimPy), the results (pandas) or the figures
(matplotlib): a fresh interpreter imports them and nothing else heavy comes along."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("simpy", "pandas", "matplotlib")


def modules_loaded_by(imports: str) -> set[str]:
    """Which of HEAVY a fresh interpreter holds after `import <imports>`."""
    code = (f"import {imports}; import sys, json; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_pure_layers_import_no_engine_results_or_figures():
    pure = ("zerosim.models, zerosim.estimate, zerosim.hardware.costs, zerosim.vocabulary, "
            "zerosim.behaviours, zerosim.stacks, zerosim.models.kernels")
    assert modules_loaded_by(pure) == set()


@pytest.mark.parametrize("module", ["zerosim.scenario", "zerosim"])
def test_scenarios_load_without_simpy_or_pandas(module):
    assert modules_loaded_by(module) & {"simpy", "pandas"} == set()


def test_the_check_sees_a_heavy_import():
    assert "pandas" in modules_loaded_by("zerosim.results.result")


@pytest.mark.parametrize("module", ["zerosim.api", "zerosim.results.summary", "zerosim.report",
                                    "zerosim.sweep.worker"])
def test_a_summary_needs_no_tables_or_figures(module):
    """`zerosim run --no-files` and a sweep point start without pandas or matplotlib."""
    assert modules_loaded_by(module) & {"pandas", "matplotlib"} == set()


@pytest.mark.parametrize("first", ["import zerosim", "import zerosim.sensitivity",
                                   "import zerosim; zerosim.sensitivity"])
def test_zerosim_sensitivity_is_the_function_whichever_import_came_first(first):
    """The package exports `sensitivity` under its module's name: a fresh interpreter calls
    the study through `zerosim.sensitivity(...)` after any order of imports (a missing
    scenario is refused by the function itself, naming the file)."""
    code = (f"{first}\nimport zerosim, zerosim.sensitivity\n"
            "try:\n    zerosim.sensitivity('no/such/scenario.yaml')\n"
            "except Exception as err:\n    print(type(err).__name__, err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert "no/such/scenario.yaml" in out.stdout and "not callable" not in out.stdout
