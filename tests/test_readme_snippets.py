"""The README's Python snippets run as a reader would paste them: each ```python block, with
only the folders it reads from filled in (a run of `llama13b_dp1` and a small bucket sweep
written here first), so a renamed function, column or argument fails here, not in a reader's
session; and the terminal it shows is the one the main job prints."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import pytest
from click.testing import CliRunner

import zerosim
from zerosim.cli import main
from zerosim.results.export import write_outputs
from zerosim.sweep import run_sweep

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"),
                    re.S)
RUN_FOLDER = '"/tmp/dp1"'
SWEEP_CSV = "results/sweeps/buckets/results.csv"


def _text_block(introduction: str) -> list[str]:
    """The lines of the README's ```text block that follows `introduction`."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.findall(re.escape(introduction) + r"[^\n]*\n(?:[^\n]+\n)*\n```text\n(.*?)```",
                       readme, re.S)
    assert len(found) == 1, f"one README text block after {introduction!r}, found {len(found)}"
    return found[0].splitlines()


def _block(marker: str) -> str:
    found = [b for b in BLOCKS if marker in b]
    assert len(found) == 1, f"one README python block with {marker!r}, found {len(found)}"
    return found[0]


def test_the_readme_has_its_python_blocks():
    assert len(BLOCKS) == 2


def test_the_simulate_snippet_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {}
    exec(compile(_block("from zerosim.vocabulary import OpKind"), "README.md", "exec"), namespace)
    assert namespace["result"].summary["status"] == "ok"


@pytest.fixture
def small_bucket_sweep(tmp_path: Path) -> Path:
    """What `zerosim sweep scenarios/sweeps/buckets.yaml` writes, on a 2 x 2 grid."""
    spec = tmp_path / "buckets.yaml"
    spec.write_text(f"base: {ROOT / 'scenarios' / 'llama13b_dp4.yaml'}\n"
                    "grid:\n"
                    "  deepspeed.zero_optimization.reduce_bucket_size: [2e8, 5e8]\n"
                    "  deepspeed.zero_optimization.sub_group_size: [1e8, 1e9]\n")
    outcome = run_sweep(spec, out_dir=tmp_path / Path(SWEEP_CSV).parent, workers=1)
    return outcome.results_csv


def test_the_plots_snippet_runs(monkeypatch, tmp_path, small_bucket_sweep):
    matplotlib.use("Agg")
    run = tmp_path / "dp1"
    write_outputs(zerosim.simulate(ROOT / "scenarios" / "llama13b_dp1.yaml"), run)
    code = _block("from zerosim import plots")
    assert RUN_FOLDER in code and SWEEP_CSV in code
    monkeypatch.chdir(tmp_path)
    exec(compile(code.replace(RUN_FOLDER, repr(str(run))), "README.md", "exec"), {})
    assert {p.suffix for p in (tmp_path / "figures").iterdir()} == {".png", ".svg"}


def test_the_terminal_shown_is_what_the_main_job_prints():
    """The README's example of `zerosim run`'s terminal is the main job's, line for line (the
    wall time of the simulation, its last line, left out)."""
    shown = _text_block("The main job's terminal (`zerosim run scenarios/llama13b_dp4.yaml")
    result = CliRunner().invoke(main, ["run", str(ROOT / "scenarios" / "llama13b_dp4.yaml"),
                                       "--no-files", "--no-progress"])
    assert result.exit_code == 0
    printed = [line.rstrip() for line in result.stdout.splitlines()
               if not line.startswith("simulated in")]
    assert shown == printed
