"""The summary from records alone (`zerosim.results.summary`) equals the DataFrame reductions
it replaces, to the bit, and equals the full result's summary."""

from __future__ import annotations

import pandas as pd
from conftest import q
from hypothesis import given, settings
from hypothesis import strategies as st

import zerosim
from zerosim.api import simulate_summary
from zerosim.engine.records import Span, Table
from zerosim.results.summary import grouped_means, total_bytes

durations = st.lists(st.floats(min_value=1e-9, max_value=1e3, allow_nan=False), min_size=1,
                     max_size=40)


@settings(max_examples=300, deadline=None)
@given(durations, st.lists(st.integers(0, 3), min_size=40, max_size=40), st.booleans())
def test_phase_means_are_pandas_grouped_means(values, ranks, by_rank):
    """pandas takes `reduceat` when the rows come rank by rank, a compensated sum when the
    ranks interleave: both, to the bit."""
    ranks = sorted(ranks[:len(values)]) if by_rank else ranks[:len(values)]
    frame = pd.DataFrame({"rank": ranks, "duration": values})
    assert sorted(grouped_means(ranks, values)) == sorted(
        frame.groupby("rank").duration.mean().tolist())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 10, allow_nan=False),
                          st.floats(0, 1e9, allow_nan=False), st.booleans()),
                min_size=1, max_size=60))
def test_pcie_totals_are_the_sorted_tables_sums(rows):
    table = Table(Span)
    for rank, start, nbytes, integral in rows:
        table.add((rank, "pcie.h2d", "forward", 0, "op", start, start + 1,
                   float(round(nbytes)) if integral else nbytes, "", ""))
    frame = pd.DataFrame(table.columns()).sort_values(["start_s", "rank", "stream"],
                                                      kind="stable")
    assert total_bytes(table, "pcie.h2d") == float(frame.bytes.sum())


def test_a_summary_alone_equals_the_full_results(toy):
    scenario = toy.scenario({"deepspeed": {"gradient_accumulation_steps": 2}}, gpus=2)
    assert simulate_summary(scenario) == zerosim.simulate(scenario).summary


def test_throughput_counts_every_micro_batch_of_every_rank(toy):
    """`tokens_per_s`: micro-batch x accumulation x ranks x sequence over the iteration."""
    scenario = toy.scenario({"deepspeed": {"train_micro_batch_size_per_gpu": 3,
                                           "gradient_accumulation_steps": 2}}, gpus=2)
    assert scenario.tokens_per_iteration == 3 * 2 * 2 * scenario.sequence_length
    summary = simulate_summary(scenario)
    assert summary["tokens_per_s"] == scenario.tokens_per_iteration / summary["iteration_s"]
    oom = simulate_summary(toy.scenario({"hardware": {"gpu": {"hbm_GiB": {
        "value": 0.05, "basis": "assumed", "source": "test"}}}}))
    assert oom["status"] == "oom" and oom["tokens_per_s"] is None


def test_memory_after_each_phase_is_rank_0_s_at_its_last_micro_batch(toy):
    """`hbm_after_GiB`: what rank 0 holds when each kind of phase ends (the non-boundary
    backward's is micro-batch 0's, the forward's the last micro-batch's)."""
    result = zerosim.simulate(toy.scenario({"deepspeed": {"gradient_accumulation_steps": 2}},
                                           gpus=2))
    phases = result.phases[result.phases["rank"] == 0]

    def end(phase, micro):
        row = phases[(phases.phase == phase) & (phases.micro_batch == micro)]
        return int(row.allocated_end_bytes.iloc[0]) / 2**30

    assert result.summary["hbm_after_GiB"] == {
        "forward": end("forward", 1), "backward_non_boundary": end("backward", 0),
        "backward_boundary": end("backward", 1), "update": end("update", 1)}


def test_a_run_that_fits_by_less_than_the_peaks_error_is_called_tight(toy, capsys):
    """A GPU given 1% more than the toy's peak: the run fits, but by less than zerosim's
    peaks err (`PEAK_ERROR_FRACTION`), and `zerosim run`'s summary says so; at twice its peak
    it says nothing."""
    from zerosim.report import render_summary
    from zerosim.results.summary import PEAK_ERROR_FRACTION, tight_memory

    peak = toy.run({}).summary["peak_hbm_GiB"]
    tight = toy.run({"hardware": {"gpu": {"hbm_GiB": q(peak * 1.01)}}}).summary
    assert tight["status"] == "ok" and tight["peak_hbm_GiB"] == peak
    assert tight_memory(tight) == [("HBM", peak, peak * 1.01)]
    assert PEAK_ERROR_FRACTION > 0.01
    roomy = toy.run({"hardware": {"gpu": {"hbm_GiB": q(peak * 2)}}}).summary
    assert tight_memory(roomy) == []
    render_summary(tight)
    printed = " ".join(capsys.readouterr().out.split())
    assert (f"tight: peak HBM {peak:.2f} of {peak * 1.01:.2f} GiB is within 4% of the "
            "capacity") in printed
