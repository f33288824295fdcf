"""The vocabulary and the record fields every layer above the engine selects on."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from zerosim import plots
from zerosim.engine.records import MemorySample, Span, Table
from zerosim.results import trace
from zerosim.results.load import _kind_columns
from zerosim.results.result import _frame
from zerosim.validation.validate import adam_spans, boundary_flush_spans
from zerosim.vocabulary import (
    BufferKind,
    Category,
    DeviceKind,
    LinkKind,
    OpKind,
    Phase,
    Stream,
    base_category,
    category_label,
    device_kind,
    device_name,
    device_parts,
    devices_of,
    resource_name,
    split_resource,
)


@pytest.mark.parametrize("category", list(Category))
@pytest.mark.parametrize("buffer", list(BufferKind))
def test_base_category_round_trips_every_label(category, buffer):
    assert base_category(category_label(category, buffer)) is category


def test_base_category_does_not_split_text():
    assert base_category("fp32 master params (GPU)") is Category.FP32_MASTER_GPU
    assert base_category("fp32 grads (pinned)") is Category.FP32_GRADS
    assert base_category("fp32 grads (GPU)") is Category.FP32_GRADS_GPU
    assert base_category("something new (pinned)") is None


def test_devices():
    for kind in DeviceKind:
        assert device_parts(device_name(kind, 12)) == (kind, 12)
        assert device_kind(device_name(kind, 0)) is kind
    assert device_parts("gpu") is None and device_parts("gpux") is None
    with pytest.raises(ValueError):
        device_kind("disk0")
    assert devices_of(["host0", "gpu10", "gpu2", "gpu2", "x"], DeviceKind.GPU) == ["gpu2",
                                                                                  "gpu10"]


SWITCH_KINDS = (LinkKind.SWITCH_H2D, LinkKind.SWITCH_D2H)


@pytest.mark.parametrize("kind", [k for k in LinkKind if k not in (
    LinkKind.HOST_MEMORY, LinkKind.SOCKET_LINK, *SWITCH_KINDS)])
def test_resource_names_round_trip(kind):
    assert split_resource(resource_name("gpu3", kind)) == ("gpu3", kind, "")


@pytest.mark.parametrize("kind", SWITCH_KINDS)
def test_a_switch_uplink_names_its_switch(kind):
    assert split_resource(f"host1.switch2.{kind}") == ("host1", kind, "switch2")
    assert trace.link_name("host0.switch1.uplink.h2d") == "host0 switch1 PCIe switch uplink H2D"


def test_resources_with_a_domain():
    assert split_resource("host0.numa1.memory") == ("host0", LinkKind.HOST_MEMORY, "numa1")
    assert split_resource("host0.numa0->numa1") == ("host0", LinkKind.SOCKET_LINK,
                                                    "numa0->numa1")
    assert split_resource("host0.other") == ("host0", None, "other")
    assert trace.link_name("host0.numa1.memory") == "host0 NUMA1 memory"
    assert trace.link_name("nvme0.nvme.write") == "nvme0 NVMe write"


def test_every_stream_has_a_track_a_name_and_a_colour():
    assert set(Stream) <= set(trace.STREAM_ORDER)
    assert set(trace.STREAM_ORDER) == set(trace.STREAM_NAMES)
    tids = {trace.thread_id(s, 0) for s in trace.STREAM_ORDER}
    assert len(tids) == len(trace.STREAM_ORDER)
    assert set(Stream) == set(plots.STREAM_COLORS) == set(plots.STREAMS)
    assert trace.stream_name("nvme.read") == "NVMe read"


def test_every_category_has_a_colour_and_a_place_in_the_stack():
    assert set(Category) == set(plots.MEMORY_COLORS)
    assert plots.memory_color("fp32 master params (GPU)") == plots.MEMORY_COLORS[
        Category.FP32_MASTER_GPU]
    assert plots._category_key("fp32 grads (pageable)")[0] == plots.MEMORY_ORDER.index(
        Category.FP32_GRADS)


def test_frames_carry_the_new_fields_last_as_plain_text():
    spans = _frame(Table.of(Span, [
        Span(0, Stream.CPU, Phase.UPDATE, 1, "cpu adam sub-group 0", 0.0, 1.0, 8.0,
             OpKind.OPTIMIZER_STEP, BufferKind.NONE),
        Span(0, "compute", "forward", 0, "fwd", 0.0, 1.0, 0.0)]))
    assert list(spans.columns[-2:]) == ["op_kind", "buffer_kind"]
    assert spans.op_kind.tolist() == ["optimizer_step", ""]
    assert all(type(v) is str for v in spans.stream) and all(type(v) is str
                                                             for v in spans.op_kind)
    memory = _frame(Table.of(MemorySample, [MemorySample(
        0.0, "host0", category_label(Category.FP32_GRADS, BufferKind.PINNED), 4,
        BufferKind.PINNED)]))
    assert list(memory.columns) == ["t_s", "device", "category", "bytes", "buffer_kind"]
    assert memory.iloc[0].tolist() == [0.0, "host0", "fp32 grads (pinned)", 4, "pinned"]
    empty = _frame(Table(Span))
    assert list(empty.columns) == list(spans.columns) and empty.empty


def test_loading_keeps_empty_kinds_as_text_and_adds_missing_ones():
    read = pd.DataFrame({"op": ["a", "b"], "op_kind": [float("nan"), "grad_flush"],
                         "buffer_kind": [float("nan")] * 2})
    assert _kind_columns("spans", read).op_kind.tolist() == ["", "grad_flush"]
    assert _kind_columns("spans", read).buffer_kind.tolist() == ["", ""]
    old = pd.DataFrame({"t_s": [0.0], "device": ["gpu0"], "category": ["grads"], "bytes": [1]})
    assert _kind_columns("memory", old).buffer_kind.tolist() == [""]


def _spans(rows: list[tuple]) -> pd.DataFrame:
    columns = ["rank", "stream", "phase", "micro_batch", "op", "start_s", "end_s", "bytes",
               "op_kind", "buffer_kind"]
    return pd.DataFrame(rows, columns=columns)


def test_validation_selects_by_op_kind_whatever_the_ops_are_called():
    spans = _spans([
        (0, "cpu", "update", 1, "adam step 0", 0.0, 1.0, 0.0, "optimizer_step", ""),
        (0, "cpu", "update", 1, "adam step 1", 1.0, 2.0, 0.0, "optimizer_step", ""),
        (1, "cpu", "update", 1, "adam step 0", 0.0, 1.0, 0.0, "optimizer_step", ""),
        (0, "optimizer.gpu", "update", 1, "gpu adam 0", 0.0, 1.0, 0.0, "optimizer_step", ""),
        (0, "cpu", "update", 1, "cpu adam lookalike", 0.0, 1.0, 0.0, "cast", ""),
        (0, "pcie.d2h", "backward", 1, "boundary grad a", 0.0, 2.0, 4e9, "grad_flush",
         "pageable"),
        (0, "pcie.d2h", "backward", 1, "fp32 flush lookalike", 0.0, 1.0, 1e9, "grad_to_host",
         "pinned"),
        (0, "cpu.flush", "backward", 1, "boundary grad cast", 0.0, 1.0, 0.0, "grad_flush", ""),
        (1, "pcie.d2h", "backward", 1, "boundary grad a", 0.0, 1.0, 1e9, "grad_flush",
         "pageable"),
    ])
    assert adam_spans(spans).op.tolist() == ["adam step 0", "adam step 1"]
    assert boundary_flush_spans(spans).op.tolist() == ["boundary grad a"]


def test_trace_slices_carry_the_kinds_that_are_set():
    spans = _spans([(0, "nvme.read", "update", 0, "swap in", 0.0, 1.0, 1.0, "swap_in",
                     "nvme"),
                    (0, "cpu", "update", 0, "other", 0.0, 1.0, 0.0, "", "")])
    empty = pd.DataFrame(columns=["rank", "phase", "micro_batch", "start_s", "end_s"])
    memory = pd.DataFrame(columns=["t_s", "device", "category", "bytes", "buffer_kind"])
    links = pd.DataFrame(columns=["t_s", "resource", "rate", "unit"])
    events = trace.build_trace(spans, empty, memory, links, "t")["traceEvents"]
    slices = {e["name"]: e for e in events if e["ph"] == "X"}
    assert slices["swap in"]["args"]["op_kind"] == "swap_in"
    assert slices["swap in"]["args"]["buffer_kind"] == "nvme"
    assert "op_kind" not in slices["other"]["args"]
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"NVMe read", "CPU"} <= names


def test_every_layers_table_of_statuses_covers_the_statuses_it_meets():
    """Statuses and verdicts are the vocabulary's: each layer that words or orders them names
    every one it can be handed, and they travel as their plain text."""
    from zerosim.report import PREDICTION_STATUS
    from zerosim.tune import STATUS_ORDER
    from zerosim.validation.report import STATUS_MARK
    from zerosim.vocabulary import JUDGED, SIMULATED, Status, Verdict

    assert set(PREDICTION_STATUS) == {Status.OK, Status.OOM, Status.REFUSED, Status.ERROR}
    assert set(STATUS_ORDER) == set(Status) - {Status.PENDING}
    assert set(STATUS_MARK) == set(Verdict)
    assert {str(s) for s in SIMULATED} == {"ok", "oom"}
    assert {str(v) for v in JUDGED} == {"pass", "fail"}
    assert json.dumps({"status": Status.OOM}) == '{"status": "oom"}'
    assert pd.DataFrame({"status": [Status.OK]}).to_csv(index=False) == "status\nok\n"
