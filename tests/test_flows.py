"""Tests of the fluid flow-sharing layer; expected values are worked out by hand in each test."""

from __future__ import annotations

import itertools
from collections.abc import Generator

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from zerosim.engine.flows import FlowNetwork, FlowRecord, RateChange, Reallocations


def _net(record_rates: bool = True) -> tuple[simpy.Environment, FlowNetwork]:
    env = simpy.Environment()
    return env, FlowNetwork(env, record_rates=record_rates)


def _start_at(
    env: simpy.Environment, net: FlowNetwork, t_s: float, amount: float, usage, **kwargs
) -> Generator[simpy.Event, object, None]:
    """Process: start one flow at ``t_s`` and wait for it."""
    yield env.timeout(t_s)
    yield net.start(amount, usage, **kwargs)


def _ends(net: FlowNetwork) -> dict[str, float]:
    return {record.label: record.end_s for record in net.records}


def test_single_flow_runs_at_capacity():
    env, net = _net()
    link = net.add_resource("link", 10.0)
    done = net.start(50.0, {link: 1.0}, label="a")
    assert net.rate_of(done) == 10.0
    env.run()
    assert done.value == FlowRecord("a", 0.0, 5.0, 50.0, ("link",))
    assert net.rate_changes == [RateChange(0.0, "link", 10.0), RateChange(5.0, "link", 0.0)]


def test_two_flows_share_then_survivor_speeds_up():
    # Both at 5/s; a (10) ends at 2 having b done 10 of 30; b then alone at 10/s: 2 + 20/10 = 4.
    env, net = _net()
    link = net.add_resource("link", 10.0)
    a = net.start(10.0, {link: 1.0}, label="a")
    b = net.start(30.0, {link: 1.0}, label="b")
    assert (net.rate_of(a), net.rate_of(b)) == (5.0, 5.0)
    env.run()
    assert net.records == [
        FlowRecord("a", 0.0, 2.0, 10.0, ("link",)),
        FlowRecord("b", 0.0, 4.0, 30.0, ("link",)),
    ]
    # The link is saturated from 0 to 4 whatever the split, so its usage changes only twice.
    assert net.rate_changes == [RateChange(0.0, "link", 10.0), RateChange(4.0, "link", 0.0)]
    net.assert_idle()


def test_flow_held_back_by_second_bottleneck():
    # a crosses L1 (10) and L2 (4); b crosses L1 only. Filling: L2 saturates first at t=4 and
    # freezes a at 4; b then takes the rest of L1: 6. a (8) ends at 8/4 = 2; b (30) has done
    # 12 by then and runs alone at 10: 2 + 18/10 = 3.8.
    env, net = _net()
    l1 = net.add_resource("L1", 10.0)
    l2 = net.add_resource("L2", 4.0)
    a = net.start(8.0, {l1: 1.0, l2: 1.0}, label="a")
    b = net.start(30.0, {l1: 1.0}, label="b")
    assert (net.rate_of(a), net.rate_of(b)) == (4.0, 6.0)
    env.run()
    assert net.records[0] == FlowRecord("a", 0.0, 2.0, 8.0, ("L1", "L2"))
    assert net.records[1].label == "b"
    assert net.records[1].end_s == pytest.approx(3.8, rel=1e-9)
    # Changes at one instant are coalesced: L1 shows 10 (not 4 then 10) at t=0.
    assert net.rate_changes[:3] == [
        RateChange(0.0, "L1", 10.0),
        RateChange(0.0, "L2", 4.0),
        RateChange(2.0, "L2", 0.0),
    ]
    assert net.rate_changes[3].resource == "L1"
    assert net.rate_changes[3].t_s == pytest.approx(3.8, rel=1e-9)
    assert net.rate_changes[3].rate == 0.0
    assert len(net.rate_changes) == 4


def test_full_duplex_directions_are_independent():
    env, net = _net()
    h2d = net.add_resource("h2d", 10.0)
    d2h = net.add_resource("d2h", 10.0)
    up = net.start(20.0, {h2d: 1.0}, label="up")
    down = net.start(30.0, {d2h: 1.0}, label="down")
    assert (net.rate_of(up), net.rate_of(down)) == (10.0, 10.0)
    env.run()
    assert _ends(net) == {"up": 2.0, "down": 3.0}


def test_max_rate_bounds_a_flow_and_the_rest_goes_to_the_other():
    # pageable (15, max 3) and pinned (70) on a 10 link: 3 and 7. pageable ends at 5; pinned
    # has done 35 and runs alone at 10: 5 + 35/10 = 8.5.
    env, net = _net()
    link = net.add_resource("link", 10.0)
    pageable = net.start(15.0, {link: 1.0}, max_rate=3.0, label="pageable")
    pinned = net.start(70.0, {link: 1.0}, label="pinned")
    assert (net.rate_of(pageable), net.rate_of(pinned)) == (3.0, 7.0)
    env.run()
    assert _ends(net) == {"pageable": 5.0, "pinned": 8.5}


def test_weights_split_a_saturated_resource_proportionally():
    _, net = _net()
    link = net.add_resource("link", 8.0)
    light = net.start(1.0, {link: 1.0}, weight=1.0)
    heavy = net.start(1.0, {link: 1.0}, weight=3.0)
    assert (net.rate_of(light), net.rate_of(heavy)) == (2.0, 6.0)


def test_memory_bound_kernel_alone():
    # 28 bytes of memory traffic per unit of work on a 280 B/s memory: 10 units/s; 50 units: 5 s.
    env, net = _net()
    mem = net.add_resource("mem", 280.0)
    kernel = net.start(50.0, {mem: 28.0}, weight=1 / 28, label="kernel")
    assert net.rate_of(kernel) == pytest.approx(10.0, rel=1e-9)
    env.run()
    assert net.records[0].end_s == pytest.approx(5.0, rel=1e-9)


def test_memory_bound_kernel_and_dma_get_equal_bytes_per_second():
    # Level t: kernel rate t/28 (28 B/unit -> t B/s), DMA t B/s; 2t = 280 -> 140 B/s each.
    # DMA (700 B) ends at 700/140 = 5. Kernel (50 units) did 5*5 = 25 units by then; the other
    # 25 at 10 units/s take 2.5 s: 7.5 (= 2100 B / 280 B/s, the memory is always saturated).
    env, net = _net()
    mem = net.add_resource("mem", 280.0)
    kernel = net.start(50.0, {mem: 28.0}, weight=1 / 28, label="kernel")
    dma = net.start(700.0, {mem: 1.0}, label="dma")
    assert net.rate_of(kernel) == pytest.approx(5.0, rel=1e-9)
    assert net.rate_of(dma) == pytest.approx(140.0, rel=1e-9)
    env.run()
    ends = _ends(net)
    assert ends["dma"] == pytest.approx(5.0, rel=1e-9)
    assert ends["kernel"] == pytest.approx(7.5, rel=1e-9)


def test_dma_slows_down_when_kernel_joins_mid_way():
    # DMA (700 B) alone at 280 B/s for 1 s: 420 B left. Kernel joins at t=1: 140 B/s each, DMA
    # ends at 1 + 420/140 = 4. Kernel did 3 s * 5 units/s = 15 of 50 units; 35 left at 10/s:
    # ends at 4 + 3.5 = 7.5.
    env, net = _net()
    mem = net.add_resource("mem", 280.0)
    env.process(_start_at(env, net, 0.0, 700.0, {mem: 1.0}, label="dma"))
    env.process(_start_at(env, net, 1.0, 50.0, {mem: 28.0}, weight=1 / 28, label="kernel"))
    env.run()
    ends = _ends(net)
    assert ends["dma"] == pytest.approx(4.0, rel=1e-9)
    assert ends["kernel"] == pytest.approx(7.5, rel=1e-9)


def test_late_flow_reschedules_the_running_one():
    # a (100) alone at 10/s would end at 10. At t=2 it has 80 left and b (10) joins: 5/s each.
    # b ends at 2 + 10/5 = 4; a has 70 left then and ends at 4 + 7 = 11.
    env, net = _net()
    link = net.add_resource("link", 10.0)
    ends: dict[str, float] = {}

    def watch(label: str, t_s: float, amount: float):
        yield env.timeout(t_s)
        record = yield net.start(amount, {link: 1.0}, label=label)
        assert record.label == label
        ends[label] = env.now

    env.process(watch("a", 0.0, 100.0))
    env.process(watch("b", 2.0, 10.0))
    env.run()
    assert ends == {"b": 4.0, "a": 11.0}
    assert _ends(net) == ends


def test_flows_finishing_together_finish_in_one_step_in_start_order():
    env, net = _net()
    link = net.add_resource("link", 10.0)
    for label in ("first", "second", "third"):
        net.start(10.0, {link: 1.0}, label=label)
    env.run()
    assert [(r.label, r.end_s) for r in net.records] == [
        ("first", 3.0),
        ("second", 3.0),
        ("third", 3.0),
    ]
    assert net.rate_changes == [RateChange(0.0, "link", 10.0), RateChange(3.0, "link", 0.0)]


def test_flow_without_resources_runs_at_its_max_rate():
    env, net = _net()
    done = net.start(10.0, {}, max_rate=4.0, label="local")
    env.run()
    assert done.value == FlowRecord("local", 0.0, 2.5, 10.0, ())


def test_zero_amount_flow_completes_immediately():
    env, net = _net()
    link = net.add_resource("link", 10.0)
    env.run(until=1.0)
    done = net.start(0.0, {link: 1.0}, label="empty")
    assert net.active_count == 0
    env.run()
    assert done.value == FlowRecord("empty", 1.0, 1.0, 0.0, ("link",))
    assert net.rate_changes == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"amount": -1.0}, "-1.0"),
        ({"coef": 0.0}, "0.0"),
        ({"coef": -2.5}, "-2.5"),
        ({"weight": 0.0}, "0.0"),
        ({"weight": -3.0}, "-3.0"),
        ({"max_rate": 0.0}, "0.0"),
        ({"max_rate": -7.0}, "-7.0"),
    ],
)
def test_invalid_flow_raises_with_the_value(kwargs, message):
    _, net = _net()
    link = net.add_resource("link", 10.0)
    amount = kwargs.pop("amount", 1.0)
    coef = kwargs.pop("coef", 1.0)
    with pytest.raises(ValueError, match=message):
        net.start(amount, {link: coef}, **kwargs)
    assert net.active_count == 0


def test_invalid_flow_messages_name_the_argument():
    _, net = _net()
    link = net.add_resource("link", 10.0)
    with pytest.raises(ValueError, match="amount"):
        net.start(-1.0, {link: 1.0})
    with pytest.raises(ValueError, match="coefficient of resource 'link'"):
        net.start(1.0, {link: 0.0})
    with pytest.raises(ValueError, match="weight"):
        net.start(1.0, {link: 1.0}, weight=0.0)
    with pytest.raises(ValueError, match="max_rate"):
        net.start(1.0, {link: 1.0}, max_rate=0.0)
    with pytest.raises(ValueError, match="max_rate"):
        net.start(1.0, {})


def test_resource_of_another_network_is_rejected():
    _, net = _net()
    _, other = _net()
    foreign = other.add_resource("link", 10.0)
    with pytest.raises(ValueError, match="does not belong"):
        net.start(1.0, {foreign: 1.0})


def test_invalid_resources_raise():
    _, net = _net()
    net.add_resource("link", 10.0)
    with pytest.raises(ValueError, match="duplicate resource name 'link'"):
        net.add_resource("link", 5.0)
    with pytest.raises(ValueError, match=r"-4\.0"):
        net.add_resource("bad", -4.0)
    with pytest.raises(ValueError, match=r"0\.0"):
        net.add_resource("zero", 0.0)


def test_rate_of_unknown_event_raises():
    env, net = _net()
    link = net.add_resource("link", 10.0)
    done = net.start(1.0, {link: 1.0})
    env.run()
    with pytest.raises(ValueError, match="not an active flow"):
        net.rate_of(done)


def test_assert_idle_names_in_flight_flows():
    env, net = _net()
    link = net.add_resource("link", 10.0)
    net.start(10.0, {link: 1.0}, label="copy-grads")
    assert net.active_count == 1
    with pytest.raises(RuntimeError, match="copy-grads"):
        net.assert_idle()
    env.run()
    assert net.active_count == 0
    net.assert_idle()


def test_rate_recording_can_be_disabled():
    env, net = _net(record_rates=False)
    link = net.add_resource("link", 10.0)
    net.start(10.0, {link: 1.0})
    env.run()
    assert net.rate_changes == []
    assert len(net.records) == 1


_FLOW = st.fixed_dictionaries(
    {
        "amount": st.floats(0.5, 100.0),
        "coefs": st.lists(st.one_of(st.none(), st.floats(0.1, 30.0)), min_size=4, max_size=4),
        "weight": st.floats(0.05, 20.0),
        "max_rate": st.one_of(st.none(), st.floats(0.5, 50.0)),
        "start_s": st.floats(0.0, 5.0),
    }
)


def _run_flows(capacities: list[float], flows: list[dict]) -> FlowNetwork:
    """Start each flow at its start time on the resources it has a coefficient for."""
    env, net = _net()
    resources = [net.add_resource(f"r{i}", cap) for i, cap in enumerate(capacities)]
    for i, flow in enumerate(flows):
        usage = {res: c for res, c in zip(resources, flow["coefs"], strict=False) if c is not None}
        max_rate = flow["max_rate"]
        if not usage and max_rate is None:
            max_rate = 1.0  # a flow crossing no resource needs its own bound
        env.process(
            _start_at(
                env,
                net,
                flow["start_s"],
                flow["amount"],
                usage,
                max_rate=max_rate,
                weight=flow["weight"],
                label=str(i),
            )
        )
    env.run()
    net.assert_idle()
    return net


@settings(max_examples=100, deadline=None)
@given(
    capacities=st.lists(st.floats(1.0, 100.0), min_size=1, max_size=4),
    flows=st.lists(_FLOW, min_size=1, max_size=6),
)
def test_recorded_usage_integrates_to_the_work_and_respects_capacity(capacities, flows):
    """(a) Each resource's recorded usage, a step function, integrates to sum(coef * amount)
    over the flows that cross it: work is conserved. (b) It never exceeds the capacity."""
    net = _run_flows(capacities, flows)
    assert len(net.records) == len(flows)
    for i, cap in enumerate(capacities):
        expected = sum(
            flow["amount"] * flow["coefs"][i] for flow in flows if flow["coefs"][i] is not None
        )
        steps = [change for change in net.rate_changes if change.resource == f"r{i}"]
        integral = sum(
            before.rate * (after.t_s - before.t_s) for before, after in itertools.pairwise(steps)
        )
        assert integral == pytest.approx(expected, rel=1e-6)
        assert all(step.rate <= cap * (1 + 1e-9) for step in steps)
        if steps:
            assert steps[-1].rate == 0.0


@settings(max_examples=100, deadline=None)
@given(
    capacity=st.floats(1.0, 100.0),
    factor=st.floats(1.0, 4.0),
    flows=st.lists(_FLOW, min_size=1, max_size=6),
)
def test_more_capacity_on_a_single_resource_never_delays_a_flow(capacity, factor, flows):
    """(c) On ONE shared resource, raising its capacity never makes any flow end later.

    Why this holds (unlike for max-min fairness over several resources, where more capacity
    on one link can re-route the bottlenecks and delay some flow): with one resource the
    filling level t solves sum(coef * min(max_rate, weight * t)) = capacity over the active
    flows, so t, and thus every active flow's rate, rises with the capacity and with fewer
    active flows. By induction over time, the faster system never has more work left on any
    flow, hence never has a flow active that the slower one has finished: each flow ends no
    later, so neither does the last one (the makespan). Start times are kept random.
    """
    single = [{**flow, "coefs": [flow["coefs"][0] or 1.0]} for flow in flows]
    slow = _ends(_run_flows([capacity], single))
    fast = _ends(_run_flows([capacity * factor], single))
    for label, end_s in fast.items():
        assert end_s <= slow[label] * (1 + 1e-9)
    assert max(fast.values()) <= max(slow.values()) * (1 + 1e-9)


@settings(max_examples=100, deadline=None)
@given(
    capacities=st.lists(st.floats(1.0, 100.0), min_size=1, max_size=4),
    flows=st.lists(_FLOW, min_size=1, max_size=6),
)
def test_allocation_is_weighted_max_min_fair(capacities, flows):
    """The allocation satisfies the bottleneck characterisation of weighted max-min fairness.

    Every flow is either at its max_rate or crosses a saturated resource on which no other
    flow has a higher rate per unit of weight (its fair level cannot rise without lowering a
    flow at an equal or lower level), and no resource is over capacity.
    """
    _, net = _net()
    resources = [net.add_resource(f"r{i}", cap) for i, cap in enumerate(capacities)]
    started = []
    for flow in flows:
        usage = {res: c for res, c in zip(resources, flow["coefs"], strict=False) if c is not None}
        if usage:
            max_rate, weight = flow["max_rate"], flow["weight"]
            event = net.start(flow["amount"], usage, max_rate=max_rate, weight=weight)
            started.append((event, usage, flow))
    rates = [net.rate_of(event) for event, _, _ in started]
    used = {res: 0.0 for res in resources}
    for rate, (_, usage, _) in zip(rates, started, strict=True):
        for res, coef in usage.items():
            used[res] += coef * rate
    assert all(used[res] <= res.capacity * (1 + 1e-9) for res in resources)
    levels = [rate / flow["weight"] for rate, (_, _, flow) in zip(rates, started, strict=True)]
    for rate, level, (_, usage, flow) in zip(rates, levels, started, strict=True):
        if flow["max_rate"] is not None and rate == pytest.approx(flow["max_rate"], rel=1e-9):
            continue
        assert any(
            used[res] >= res.capacity * (1 - 1e-9)
            and all(
                level >= other * (1 - 1e-9)
                for other, (_, other_usage, _) in zip(levels, started, strict=True)
                if res in other_usage
            )
            for res in usage
        )


def test_finished_bridge_flow_speeds_up_both_sides():
    # a on L1, b on L1 and L2, c on L2 (both 10/s): 5/s each. b (5) ends at 1 and splits the
    # component in two; both a and c must be recomputed: 10/s each. a (30) has 25 left: ends
    # at 3.5; c (20) has 15 left: ends at 2.5. Both links stay saturated until then.
    env, net = _net()
    l1 = net.add_resource("L1", 10.0)
    l2 = net.add_resource("L2", 10.0)
    a = net.start(30.0, {l1: 1.0}, label="a")
    b = net.start(5.0, {l1: 1.0, l2: 1.0}, label="b")
    c = net.start(20.0, {l2: 1.0}, label="c")
    assert (net.rate_of(a), net.rate_of(b), net.rate_of(c)) == (5.0, 5.0, 5.0)
    env.run(until=b)
    assert env.now == 1.0
    assert (net.rate_of(a), net.rate_of(c)) == (10.0, 10.0)
    env.run()
    assert _ends(net) == {"b": 1.0, "c": 2.5, "a": 3.5}
    assert net.rate_changes == [
        RateChange(0.0, "L1", 10.0),
        RateChange(0.0, "L2", 10.0),
        RateChange(2.5, "L2", 0.0),
        RateChange(3.5, "L1", 0.0),
    ]


def test_flow_on_a_disjoint_resource_leaves_other_rates_alone():
    env, net = _net()
    shared = net.add_resource("shared", 12.0)
    other = net.add_resource("other", 5.0)
    a = net.start(12.0, {shared: 1.0}, label="a")
    b = net.start(12.0, {shared: 2.0}, label="b")
    assert (net.rate_of(a), net.rate_of(b)) == (4.0, 4.0)
    c = net.start(5.0, {other: 1.0}, label="c")
    assert (net.rate_of(a), net.rate_of(b), net.rate_of(c)) == (4.0, 4.0, 5.0)
    env.run()
    assert _ends(net) == {"c": 1.0, "a": 3.0, "b": 3.0}


def test_records_can_be_disabled():
    env, net = _net()
    link = net.add_resource("link", 10.0)
    env_off = simpy.Environment()
    net_off = FlowNetwork(env_off, keep_records=False)
    link_off = net_off.add_resource("link", 10.0)
    done = [net.start(amount, {link: 1.0}) for amount in (10.0, 30.0, 0.0)]
    done_off = [net_off.start(amount, {link_off: 1.0}) for amount in (10.0, 30.0, 0.0)]
    env.run()
    env_off.run()
    assert all(event.ok and event.value is None for event in done_off)
    assert net_off.records == []
    assert [event.value.end_s for event in done] == [2.0, 4.0, 0.0]
    assert net_off.rate_changes == net.rate_changes


def _reference_rates(
    capacities: list[float], flows: list[tuple[dict[int, float], float, float | None]]
) -> list[float]:
    """Weighted max-min fair rates by plain progressive filling over ALL the given flows.

    ``flows`` holds (usage by resource index, weight, max_rate). This is the textbook
    algorithm with every sum recomputed from scratch each round: the reference that the
    network's incremental, component-local recompute must agree with.
    """
    rates: list[float | None] = [None] * len(flows)
    used = [0.0] * len(capacities)
    level = 0.0
    while None in rates:
        live = [i for i, rate in enumerate(rates) if rate is None]
        saturation = {}
        for res, cap in enumerate(capacities):
            load = sum(flows[i][0][res] * flows[i][1] for i in live if res in flows[i][0])
            if load > 0:
                saturation[res] = max(level, (cap - used[res]) / load)
        limits = [flows[i][2] / flows[i][1] for i in live if flows[i][2] is not None]
        level = max(level, min([*saturation.values(), *limits]))
        threshold = level * (1 + 1e-12)
        saturated = {res for res, limit in saturation.items() if limit <= threshold}
        for i in live:
            usage, weight, max_rate = flows[i]
            at_max = max_rate is not None and max_rate / weight <= threshold
            if at_max or saturated & usage.keys():
                rate = weight * level if max_rate is None else min(weight * level, max_rate)
                rates[i] = rate
                for res, coef in usage.items():
                    used[res] += coef * rate
    return [rate for rate in rates if rate is not None]


_SPARSE_FLOW = st.fixed_dictionaries(
    {
        "amount": st.floats(0.5, 100.0),
        "coefs": st.lists(
            st.one_of(st.none(), st.none(), st.floats(0.1, 30.0)), min_size=6, max_size=6
        ),
        "weight": st.floats(0.05, 20.0),
        "max_rate": st.one_of(st.none(), st.floats(0.5, 50.0)),
        "start_s": st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.5]),
    }
)


@settings(max_examples=150, deadline=None)
@given(
    capacities=st.lists(st.floats(1.0, 100.0), min_size=6, max_size=6),
    flows=st.lists(_SPARSE_FLOW, min_size=1, max_size=10),
)
def test_component_local_recompute_matches_a_full_recompute(capacities, flows):
    """After every start and every completion, the rates of all active flows equal those of
    a from-scratch allocation over all of them, though the network only recomputed the
    component(s) touched by the change (sparse usages make several components)."""
    env, net = _net()
    resources = [net.add_resource(f"r{i}", cap) for i, cap in enumerate(capacities)]
    started: list[tuple[simpy.Event, tuple[dict[int, float], float, float | None]]] = []

    def check() -> None:
        active = [(event, spec) for event, spec in started if not event.triggered]
        expected = _reference_rates(capacities, [spec for _, spec in active])
        actual = [net.rate_of(event) for event, _ in active]
        assert actual == pytest.approx(expected, rel=1e-9)

    def run(flow: dict) -> Generator[simpy.Event, object, None]:
        yield env.timeout(flow["start_s"])
        usage = {i: c for i, c in enumerate(flow["coefs"]) if c is not None}
        max_rate = flow["max_rate"] if usage or flow["max_rate"] else 1.0
        event = net.start(
            flow["amount"],
            {resources[i]: c for i, c in usage.items()},
            max_rate=max_rate,
            weight=flow["weight"],
        )
        started.append((event, (usage, flow["weight"], max_rate)))
        check()
        yield event
        check()

    for flow in flows:
        env.process(run(flow))
    env.run()
    net.assert_idle()


class _Forgetful(Reallocations):
    """A memo that remembers nothing: every reallocation is worked out afresh."""

    def remember(self, table, key, after, reallocation):
        return self.state(after), reallocation


def _busy_network(remember: bool) -> FlowNetwork:
    """Flows of a few recurring shapes over shared resources, started at staggered times;
    with `remember=False` every allocation is computed afresh."""
    env, net = _net()
    if not remember:
        net._memo = _Forgetful()
    links = [net.add_resource(f"link{i}", 10.0 + i) for i in range(3)]
    memory = net.add_resource("memory", 17.0)
    shapes = [({links[0]: 1.0, memory: 2.0}, {}), ({links[1]: 1.0, memory: 3.0}, {"weight": 0.5}),
              ({links[2]: 1.0}, {"max_rate": 4.0}), ({memory: 1.0, links[0]: 0.5}, {})]
    for i in range(60):
        usage, kwargs = shapes[(i * 7) % len(shapes)]
        env.process(_start_at(env, net, 0.25 * (i % 13), 5.0 + i % 5, usage, label=str(i),
                              **kwargs))
    env.run()
    return net


def test_remembered_allocations_are_the_computed_ones():
    """The allocation memo (by flow shapes in start order) changes no bit of any result."""
    remembered, computed = _busy_network(True), _busy_network(False)
    assert remembered.records == computed.records
    assert remembered.rate_changes == computed.rate_changes
    assert remembered._memo.size and not computed._memo.size


def _rates_in_order(order: list[int]) -> list[float]:
    """Start three flows with coefficients whose sums round differently in different orders,
    in `order`; their rates, by flow."""
    _, net = _net()
    memory = net.add_resource("memory", 3.0)
    coefs = [0.1, 0.2, 0.3]  # (0.1 + 0.2) + 0.3 != (0.3 + 0.2) + 0.1
    events = {i: net.start_usage(1.0, net.usage({memory: coefs[i]})) for i in order}
    return [net.rate_of(events[i]) for i in range(3)]


def test_allocation_does_not_depend_on_the_start_order():
    """Each resource's load is an exact sum: flows that started in another order get the
    same rates, bit for bit (what lets one flow stand for its mirror images)."""
    rates = [_rates_in_order(list(order)) for order in itertools.permutations(range(3))]
    assert all(r == rates[0] for r in rates)


def test_a_flow_with_copies_gets_the_rate_of_each_copy():
    """A flow standing for two mirror flows (`usage(..., copies=...)`) loads every resource as
    both do and runs at the rate each gets: here a shared memory and CPU, one link each."""
    def network(folded: bool) -> list[float]:
        env, net = _net()
        links = [net.add_resource(f"gpu{g}.pcie", 5.0) for g in range(2)]
        numa = [net.add_resource(f"numa{d}", 7.0) for d in range(2)]
        cpu = net.add_resource("cpu", 3.0)
        shapes = [{links[g]: 1.0, numa[g]: 0.75, numa[1 - g]: 0.25} for g in range(2)]
        kernel = [{cpu: 0.3, numa[g]: 0.4, numa[1 - g]: 0.4} for g in range(2)]
        if folded:
            started = [net.start_usage(9.0, net.usage(shapes[0], copies=[shapes[1]])),
                       net.start_usage(4.0, net.usage(kernel[0], weight=0.5,
                                                      copies=[kernel[1]]))]
        else:
            started = [net.start_usage(9.0, net.usage(shape)) for shape in shapes]
            started += [net.start_usage(4.0, net.usage(k, weight=0.5)) for k in kernel]
        rates = [net.rate_of(e) for e in started]
        env.run()
        return rates + [r.rate for r in net.rate_changes if r.t_s == 0.0]

    full, folded = network(False), network(True)
    assert full[0] == full[1] and full[2] == full[3]
    assert folded[:2] == [full[0], full[2]]
    assert folded[2:] == full[4:]
