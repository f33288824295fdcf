"""Figures the README and docs/ quote from `zerosim validate`'s cells, held to what the code
computes now: a model change that moves them fails here until the prose is brought up to date
(the tables are rebuilt whole, the sentences' figures found in the text whatever its line
breaks). What they quote of the shipped sweeps and of single runs: test_sweep_figures.py."""

from pathlib import Path

import pytest

from zerosim.validation.validate import NVME_GROUP, POLARIS_GROUP
from zerosim.vocabulary import JUDGED, Verdict

ROOT = Path(__file__).resolve().parent.parent


def _page(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


README = _page("README.md")
SERIES_TIMES = ("forward", "backward", "iteration", "between phases")
SERIES_HEADER = ("| series | time | per micro-batch, predicted/measured | "
                 "per step, predicted/measured |")


@pytest.fixture(scope="module")
def cells(validation_cells):
    return {(c.group, c.case, c.quantity): c for c in validation_cells}


def _series_row(cells, case: str, time: str) -> str:
    """One row of the README's accumulation-series table, as predict splits the time."""
    each = cells[(POLARIS_GROUP, case, f"{time}: what each micro-batch adds")]
    once = cells[(POLARIS_GROUP, case, f"{time}: what the step adds once")]
    per_micro_batch = (f"{each.simulated:.3f}/{each.measured:.3f} s, "
                       f"{each.simulated / each.measured - 1:+.1%}")
    per_step = f"{once.simulated:.2f}/{once.measured:.2f} s"
    if time != "forward":
        per_step += f", {once.simulated - once.measured:+.2f} s"
    name = case.removeprefix("polaris-") if time == SERIES_TIMES[0] else ""
    return "|" + "|".join(f" {part} " if part else " "
                          for part in (name, time, per_micro_batch, per_step)) + "|"


def test_the_accumulation_series_table_is_what_validate_computes(cells):
    cases = list(dict.fromkeys(key[1] for key in cells if key[0] == POLARIS_GROUP
                               and key[2].endswith(": what each micro-batch adds")))
    assert len(cases) == 2
    expected = [_series_row(cells, case, time) for case in cases for time in SERIES_TIMES]
    lines = README.splitlines()
    start = lines.index(SERIES_HEADER) + 2
    assert lines[start:start + len(expected)] == expected


def test_the_backward_each_micro_batch_adds_the_readme_quotes_is_validates(cells):
    """README, "Software stacks": the Polaris series' backward a micro-batch adds, both models."""
    added = [cells[key] for key in cells if key[0] == POLARIS_GROUP
             and key[2] == "backward: what each micro-batch adds"]
    assert [cell.case.split("-")[1] for cell in added] == ["11.20b", "5.90b"]
    big, small = added
    figure = (f"each micro-batch adds is {small.simulated:.2f} s (5.9B; {small.measured:.2f} s "
              f"measured) and {big.simulated:.2f} s (11.2B; {big.measured:.2f} s measured): "
              f"{small.rel_error:+.1%} and {big.rel_error:+.1%}")
    assert figure in " ".join(README.split())


def test_the_readmes_validation_summary_is_the_reports(validation_cells):
    """README, "Validation against published measurements": the summary by group, as `zerosim
    validate`'s report writes it from the cells."""
    from zerosim.validation.report import summary_table

    expected = summary_table(validation_cells)
    lines = README.splitlines()
    start = lines.index(expected[0])
    assert lines[start:start + len(expected)] == expected


def _errors(cells, group: str, quantity: str) -> list[float]:
    """The relative errors of a group's judged cells of one quantity."""
    return [c.rel_error for (g, _, q), c in cells.items()
            if g == group and q == quantity and c.status in JUDGED]


def _rms(errors: list[float]) -> str:
    return f"{(sum(e * e for e in errors) / len(errors)) ** 0.5:.1%}"


def _span(errors: list[float]) -> str:
    """`-4.3..+5.8%`, as the trust table writes a range of errors."""
    return f"{min(errors) * 100:+.1f}..{max(errors) * 100:+.1f}%"


def _polaris(cells, phase: str) -> list[float]:
    return _errors(cells, POLARIS_GROUP, f"{phase} per step")


def _quoted_figures(cells) -> list[str]:
    """What the README's trust table and predict section quote of the validation, each
    written from the cells as the README words it."""
    return [
        f"Polaris forwards rms {_rms(_polaris(cells, 'forward'))}, backwards "
        f"{_rms(_polaris(cells, 'backward'))}",
        f"H100 forwards {_span(_errors(cells, NVME_GROUP, 'forward per step'))}, backwards "
        f"{_span(_errors(cells, NVME_GROUP, 'backward per step'))}",
        f"Table 2 {_span(_errors(cells, 'Table 2', 'backward_boundary'))} (in-sample)",
        f"Polaris rms {_rms(_polaris(cells, 'update'))} "
        f"({_span(_polaris(cells, 'update'))}), Table 2 "
        f"{_span(_errors(cells, 'Table 2', 'update'))}",
        "the values shipped give rms " + ", ".join(
            _rms(_polaris(cells, phase)) for phase in ("forward", "backward", "update"))
        + f" and {_rms(_polaris(cells, 'iteration'))}",
    ]


def _signed(error: float) -> str:
    return f"{error * 100:+.1f}%"


def _from_to(errors: list[float]) -> str:
    """`-2.6% to +6.1%`, as docs/validation.md writes a range of errors."""
    return f"{_signed(min(errors))} to {_signed(max(errors))}"


def _table2(cells, phase: str) -> list[float]:
    """Table 2's errors of one phase at DP=1, 2 and 4."""
    return [cells[("Table 2", f"DP={dp}", phase)].rel_error for dp in (1, 2, 4)]


def _validation_page_figures(cells) -> list[str]:
    """What docs/validation.md quotes of Table 2, of the H200 VM's real runs, of the H100
    node's MLP-Offload runs, of the Polaris peaks, of the H200's layers and of PyTorch's H100
    GEMMs."""
    forwards = [_signed(error) for error in _table2(cells, "forward")]
    boundary = [_signed(error) for error in _table2(cells, "backward_boundary")]
    vm = "DeepSpeed 0.19.5 ZeRO-3 offload on one H200 (a real run)"

    def to(group: str, quantity: str) -> str:
        return _from_to(_errors(cells, group, quantity))

    four = {case for (g, case, q) in cells if g == vm and q == "update (median of 4 iterations)"}
    memory = [c.rel_error for (g, case, q), c in cells.items()
              if g == vm and case in four and q.startswith("peak allocated GPU memory")]
    adam = [c.rel_error for (g, _, q), c in cells.items()
            if g == vm and q.startswith("DeepSpeedCPUAdam.step calls")]

    gemms = _errors(cells, "GPU kernels (H100)", "PyTorch BF16 throughput")
    gemms_pass = sum(c.status == Verdict.PASS for (g, _, q), c in cells.items()
                     if (g, q) == ("GPU kernels (H100)", "PyTorch BF16 throughput"))
    return [
        f"backwards {to(NVME_GROUP, 'backward per step')}, steps "
        f"{to(NVME_GROUP, 'update per step')}, iterations {to(NVME_GROUP, 'iteration per step')}, "
        f"forwards {to(NVME_GROUP, 'forward per step')}",
        f"peak memory {to(NVME_GROUP, 'rank 0 peak allocated GPU memory')}, the forward's peak "
        f"{to(NVME_GROUP, 'rank 0 peak allocated GPU memory in the forward')}",
        "Every peak on Polaris is now within "
        f"{to(POLARIS_GROUP, 'rank 0 peak allocated GPU memory')}",
        f"forward {to('GPU kernels (H200)', 'forward per layer')}, backward "
        f"{to('GPU kernels (H200)', 'backward per layer')}",
        f"PyTorch's H100 GEMMs {_from_to(gemms)}, {gemms_pass} of "
        f"{len(gemms)} passing",
        f"The forwards are {forwards[0]}, {forwards[1]} and {forwards[2]} at DP=1, 2 and 4",
        f"DP=1's boundary backward ({boundary[0]}; DP=2 {boundary[1]})",
        f"The DP=4 boundary backward is {boundary[2]}",
        f"The updates come out {to(vm, 'update (median of 4 iterations)')} and the Adam calls "
        f"{_from_to(adam)}",
        f"the memory {_from_to(memory)}, the forwards "
        f"{to(vm, 'forward (median of 4 iterations)')} and the backwards "
        f"{to(vm, 'backward (median of 4 iterations)')}",
    ]


@pytest.mark.parametrize(("page", "figures"), [("README.md", _quoted_figures),
                                               ("docs/validation.md", _validation_page_figures)])
def test_the_error_figures_a_page_quotes_are_the_validations(cells, page, figures):
    """Each figure as its sentence words it, wherever the page's lines break."""
    prose = " ".join(_page(page).split())
    missing = [figure for figure in figures(cells) if figure not in prose]
    assert missing == []


def test_the_growth_between_the_phases_the_readme_quotes_is_the_polaris_cells(cells):
    """README, multi-node and the trust table: what the Polaris runs spend between their phases
    beyond zerosim at DP=2 and 4, less DP=1's (`loop_gap.data_parallel_growth` over validate's
    cells), and that per rank past the first."""
    from zerosim.validation.loop_gap import data_parallel_growth
    from zerosim.validation.polaris import case_name, configurations

    gaps = []
    for configuration in configurations():
        case = f"{case_name(configuration.first)} (x{len(configuration.runs)})"
        cell = cells[(POLARIS_GROUP, case, "between the phases, per step")]
        gaps.append((configuration.first, cell.measured, cell.simulated))
    growth = data_parallel_growth(gaps)
    prose = " ".join(README.split())
    figures = [f"about {growth[2]:.2f} s a step at DP=2 and {growth[4]:.2f} s at DP=4",
               f"about {growth[4] / 3:.2f} s more for each rank beyond the fourth"]
    assert [figure for figure in figures if figure not in prose] == []
    assert prose.count(figures[0]) == 2


NVME_MEMORY = ("rank 0 allocated GPU memory after the forward",
               "rank 0 allocated GPU memory after the backward",
               "rank 0 allocated GPU memory after the update",
               "rank 0 peak allocated GPU memory in the forward",
               "rank 0 peak allocated GPU memory")
"""docs/zero3_memory.md's MLP-Offload table's columns, in its order."""


def test_the_mlp_offload_memory_table_is_validates(cells):
    """docs/zero3_memory.md: each run's row, measured / zerosim GiB, as validate's cells."""
    group = NVME_GROUP
    runs = dict.fromkeys(case for g, case, _ in cells if g == group)
    assert len(runs) == 4
    page = _page("docs/zero3_memory.md").splitlines()
    for run in runs:
        size = run.removeprefix("mlp-offload-").split("b-")[0]
        found = [line for line in page if line.startswith(f"| {size}B (")]
        expected = " | ".join(f"{cells[(group, run, q)].measured:.2f} / "
                              f"{cells[(group, run, q)].simulated:.2f}" for q in NVME_MEMORY)
        assert len(found) == 1 and found[0].endswith(f"| {expected} |"), (run, found)


ZERO2_ROWS = {"Qwen2.5-3B, unbound": "qwen2.5-3b unbound",
              "Qwen2.5-3B, `--bind_cores_to_rank`": "qwen2.5-3b bound",
              "Qwen2.5-1.5B, bound": "qwen2.5-1.5b bound",
              "Qwen2.5-1.5B, no offload": "qwen2.5-1.5b without offload",
              "binding speed-up, 3B": "binding speed-up, 3B (blog)",
              "Qwen2.5-3B, ZenFlow, its first binding (0.17.5), unbound":
                  "qwen2.5-3b ZenFlow, its own binding",
              "Qwen2.5-3B, ZenFlow, new worker binding (0.17.6), unbound":
                  "qwen2.5-3b ZenFlow, new worker binding",
              "Qwen2.5-3B, ZenFlow, new worker binding, bound":
                  "qwen2.5-3b ZenFlow, bound, new worker binding",
              "Qwen2.5-1.5B, ZenFlow, bound": "qwen2.5-1.5b ZenFlow, bound",
              "ZenFlow over bound ZeRO Offload, 3B": "ZenFlow over ZeRO Offload, bound, 3B"}
"""docs/validation.md's ZeRO-2 Offload table's rows, by validate's case."""


def test_the_zero2_offload_table_gives_validates_figures(cells):
    """docs/validation.md, ZeRO-2 Offload on a DGX A100: each row's zerosim column, as
    validate's cell (3 decimals)."""
    group = "ZeRO-2 Offload on a DGX A100 (DeepSpeed 0.17)"
    simulated = {case: c.simulated for (g, case, _), c in cells.items() if g == group}
    page = _page("docs/validation.md").splitlines()
    for label, case in ZERO2_ROWS.items():
        found = [line.split(" | ") for line in page if line.startswith(f"| {label} | ")]
        assert len(found) == 1 and found[0][2] == f"{simulated[case]:.3f}", (label, found)
