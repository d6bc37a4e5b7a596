"""conv2d(..., autotune=True) and its parts: the candidate plans (direct variants, Winograd
tiles), each computing the layer exactly; the choice following the timings (made up here, so
the test decides which plan must win), kept per layer and thread count, in this process or
in the measurements file, read back by algorithm="auto" and by a Relax build; a stored plan a
layer cannot take ignored with a warning; and one real timing run on a small layer.

What this does not cover: whether the fastest plan is found on a given host (that is a
measurement: `bench conv2d --exhaustive --cache network` prints it)."""

import json
import logging

import numpy as np
import pytest

import schedules
from microkernels import ISAS
from schedules.common import tuned
from schedules.conv import autotune, direct, dispatch
from schedules.conv.geometry import NO_POST_OPS, ConvBlocking, ConvParams, Geometry

from ...conv_reference import ref_conv2d
from ...x86_exec import HOST

ISA = ISAS[HOST[4:]]
LAYER = dict(data_shape=(1, 32, 14, 14), weight_shape=(32, 32, 3, 3), padding=1)  # direct variants and F(2/4/6)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Nothing timed before the test, in this process."""
    monkeypatch.setattr(tuned, "_MEMORY", {})


@pytest.fixture
def timings(monkeypatch):
    """Replace the timing with a made-up table: `made_up["fastest"]` is the label that wins."""
    calls = []
    made_up = {"fastest": None}

    def fake(ops, budget=autotune.BUDGET, seed=0):
        calls.append(list(ops))
        return {label: (1e-3 if label == made_up["fastest"] else 2e-3 + 1e-4 * i) for i, label in enumerate(ops)}

    monkeypatch.setattr(autotune, "time_candidates", fake)
    made_up["calls"] = calls
    return made_up


def params(**kw):
    return ConvParams(kw["data_shape"], kw["weight_shape"], stride=kw.get("stride", 1), padding=kw.get("padding", 0),
                      groups=kw.get("groups", 1))


def labels(conv, threads=2):
    return [dispatch.choice_label(c) for c in dispatch.candidates(conv, ISA, threads)]


def test_candidates_start_with_the_planned_direct_conv_and_add_winograd_where_it_applies():
    conv = params(**LAYER)
    got = labels(conv)
    planned = direct.planned(Geometry.of(conv), ISA, dispatch.DEFAULT_TILES[ISA.name][0], ConvBlocking(), 2)
    assert got[0] == planned.label and got[-3:] == ["F(2)", "F(4)", "F(6)"]
    assert len(got) == len(set(got)) >= 5  # variants of the direct conv beside the planned one
    assert not any(label.startswith("F(") for label in labels(params(data_shape=(1, 32, 14, 14),
                                                                      weight_shape=(32, 32, 1, 1))))
    # The depthwise family's layers: its pixel step and bands; a 1x1 one stays plain TIR, one plan.
    dw = labels(params(data_shape=(1, 32, 14, 14), weight_shape=(32, 1, 3, 3), padding=1, groups=32))
    assert len(dw) >= 2 and all(label.startswith("depthwise ") for label in dw)
    assert len(labels(params(data_shape=(1, 32, 14, 14), weight_shape=(32, 1, 1, 1), groups=32))) == 1


@pytest.mark.parametrize("layer", [
    LAYER,
    dict(data_shape=(1, 32, 7, 7), weight_shape=(64, 32, 3, 3), padding=1),  # two output blocks per tile
    dict(data_shape=(2, 16, 9, 30), weight_shape=(32, 16, 1, 1), stride=2),  # batch 2, strided, odd rows
    dict(data_shape=(1, 32, 10, 10), weight_shape=(64, 4, 3, 3), padding=1, groups=8),  # block-diagonal groups
    dict(data_shape=(1, 48, 14, 14), weight_shape=(48, 1, 3, 3), padding=1, groups=48),  # depthwise
    dict(data_shape=(2, 24, 7, 9), weight_shape=(24, 1, 3, 3), stride=2, padding=1, groups=24),  # depthwise, s2, odd
    dict(data_shape=(1, 32, 12, 12), weight_shape=(32, 4, 3, 3), padding=1, groups=8),  # groups in the lanes
], ids=["3x3", "7x7-two-blocks", "1x1-s2-batch2", "grouped", "depthwise", "depthwise-s2-batch2", "lane-groups"])
def test_every_candidate_computes_the_layer(rng, layer):
    conv = params(**layer)
    x = rng.standard_normal(conv.data_shape, np.float32)
    w = rng.standard_normal(conv.weight_shape, np.float32)
    want = ref_conv2d(x, w, stride=conv.stride, padding=conv.padding[:2], groups=conv.groups)
    plans = dispatch.scheduled_candidates(conv, NO_POST_OPS, ISA, 2)
    assert len(plans) >= 2
    for choice, s in plans:
        got = s.build()(x, w)
        assert dispatch.plan_label(s.plan) == dispatch.choice_label(choice)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3, err_msg=dispatch.choice_label(choice))


def test_a_variant_the_layer_cannot_run_is_refused():
    g = Geometry.of(params(data_shape=(1, 16, 56, 56), weight_shape=(16, 16, 3, 3), padding=1))
    with pytest.raises(ValueError, match="output rows"):
        direct.Variant(28, 1, 5, True).check(g, ISA)  # 5 does not divide 56 rows
    with pytest.raises(ValueError, match="two output blocks"):
        direct.Variant(28, 2, 8, True).check(g, ISA)  # one output block only


@pytest.mark.parametrize("fastest_index", [1, -1], ids=["a-direct-variant", "winograd-F6"])
def test_autotune_runs_the_fastest_and_auto_keeps_it(rng, timings, fastest_index):
    conv = params(**LAYER)
    timings["fastest"] = labels(conv)[fastest_index]
    op = schedules.conv2d(**LAYER, threads=2, autotune=True)
    assert dispatch.plan_label(op.plan) == timings["fastest"]
    assert op.plan.source == "autotuned (this process)" and "fastest of this layer's plans" in op.plan.reason
    # Timed once; algorithm="auto" takes the same plan from then on, with or without autotune.
    again = schedules.conv2d(**LAYER, threads=2)
    assert dispatch.plan_label(again.plan) == timings["fastest"] and len(timings["calls"]) == 1
    schedules.conv2d(**LAYER, threads=2, autotune=True)
    assert len(timings["calls"]) == 1
    # Kept per thread count: one thread is another layer to time.
    assert schedules.conv2d(**LAYER, threads=1).plan.source == "defaults"
    # algorithm="direct" is still the direct conv's planned variant.
    assert schedules.conv2d(**LAYER, threads=2, algorithm="direct").plan.source == "defaults"
    x = rng.standard_normal(conv.data_shape, np.float32)
    w = rng.standard_normal(conv.weight_shape, np.float32)
    np.testing.assert_allclose(op(x, w), ref_conv2d(x, w, padding=1), rtol=1e-4, atol=1e-3)


def test_the_measurements_file_keeps_the_choice_for_the_next_process(tmp_path, monkeypatch, timings):
    where = tmp_path / "tuned.json"
    monkeypatch.setenv(tuned.ENV, str(where))
    timings["fastest"] = "F(2)"
    schedules.conv2d(**LAYER, threads=2, autotune=True)
    entry, = json.loads(where.read_text())["layers"]
    assert entry["layer"] == dispatch.layer_key(params(**LAYER)) and entry["threads"] == 2
    assert entry["choice"] == {"algorithm": "winograd", "tile": 2} and len(entry["seconds"]) == len(labels(params(**LAYER)))
    tuned._MEMORY.clear()
    op = schedules.conv2d(**LAYER, threads=2)
    assert op.plan.source == f"tuned ({where})" and op.plan.tile == 2
    # again=True times it anew; the file keeps one entry per layer and thread count.
    timings["fastest"] = labels(params(**LAYER))[0]
    dispatch.measure(params(**LAYER), threads=2, again=True)
    assert len(json.loads(where.read_text())["layers"]) == 1
    assert schedules.conv2d(**LAYER, threads=2).plan.algorithm == "direct"


@pytest.mark.parametrize("layer", [
    LAYER,
    dict(data_shape=(1, 32, 14, 14), weight_shape=(32, 1, 3, 3), padding=1, groups=32),
    dict(data_shape=(1, 32, 12, 12), weight_shape=(32, 4, 3, 3), padding=1, groups=8),
    dict(data_shape=(1, 32, 10, 10), weight_shape=(64, 4, 3, 3), padding=1, groups=8),
], ids=["direct-winograd", "depthwise", "lane-groups", "block-diagonal"])
def test_every_family_s_choice_is_read_back_from_the_file(tmp_path, monkeypatch, timings, layer):
    """What autotune writes for each family passes the file's own checks (a choice the reader
    refused made it drop the whole file, and the next save lost every measurement)."""
    where = tmp_path / "tuned.json"
    monkeypatch.setenv(tuned.ENV, str(where))
    tuned.save({"matmul_tiles": {ISA.name: [[8, 32, 0.9]]}})
    timings["fastest"] = labels(params(**layer))[-1]
    schedules.conv2d(**layer, threads=2, autotune=True)
    tuned._MEMORY.clear()
    assert tuned.current() is not None and tuned.matmul_tiles(ISA.name) == ((8, 32, 0.9),)
    op = schedules.conv2d(**layer, threads=2)
    assert op.plan.source == f"tuned ({where})" and dispatch.plan_label(op.plan) == timings["fastest"]


@pytest.mark.parametrize("choice", [
    {"algorithm": "winograd", "tile": 3},
    {"algorithm": "direct", "mr": 28, "blocks": 2, "band_rows": 4, "band_parallel": True},
    {"algorithm": "direct", "mr": 28, "band_rows": 7},
    {"algorithm": "depthwise", "step": 4, "band_rows": 7},
], ids=["no-such-tile", "two-blocks-on-one", "missing-field", "another-family"])
def test_a_stored_plan_the_layer_cannot_take_is_ignored_with_a_warning(monkeypatch, caplog, choice):
    conv = params(data_shape=(1, 16, 28, 28), weight_shape=(16, 16, 3, 3), padding=1)
    monkeypatch.setitem(tuned._MEMORY, (ISA.name, dispatch.layer_key(conv), 2),
                        {"isa": ISA.name, "layer": dispatch.layer_key(conv), "threads": 2, "choice": choice,
                         "seconds": {"x": 1e-3}})
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.autotune"):
        op = schedules.conv2d((1, 16, 28, 28), (16, 16, 3, 3), padding=1, threads=2)
    assert op.plan.source == "defaults" and "ignoring the measured plan" in caplog.text


@pytest.mark.parametrize("kw, error", [
    (dict(autotune=1), TypeError),
    (dict(autotune=True, algorithm="direct"), ValueError),
    (dict(autotune=True, emulate=True), ValueError),
])
def test_autotune_arguments_are_checked(kw, error):
    with pytest.raises(error, match="autotune"):
        schedules.conv2d(**LAYER, **kw)


def test_a_real_timing_keeps_the_fastest_it_measured(rng):
    """No made-up table: the kept plan is the one its own timings put first, and it computes."""
    conv = params(data_shape=(1, 16, 8, 8), weight_shape=(32, 16, 3, 3), padding=1)
    entry = dispatch.measure(conv, threads=1, budget=0.05)
    seconds = entry["seconds"]
    assert set(seconds) == set(labels(conv, threads=1)) and all(v > 0 for v in seconds.values())
    assert dispatch.choice_label(entry["choice"]) == min(seconds, key=seconds.get)
    op = schedules.conv2d(conv.data_shape, conv.weight_shape, padding=1, threads=1)
    assert dispatch.plan_label(op.plan) == min(seconds, key=seconds.get)
    x = rng.standard_normal(conv.data_shape, np.float32)
    w = rng.standard_normal(conv.weight_shape, np.float32)
    np.testing.assert_allclose(op(x, w), ref_conv2d(x, w, padding=1), rtol=1e-4, atol=1e-3)


def test_time_candidates_drops_the_slow_ones_after_the_first_rounds(monkeypatch):
    """The budget goes to the plans still in the race: one ten times slower than the leader is
    called in the first rounds only; each figure is the median of the candidate's calls."""
    ops = {label: schedules.conv2d((1, 16, 8, 8), (16, 16, 3, 3), padding=1, threads=1, algorithm=alg, tile=tile)
           for label, alg, tile in (("a", "direct", None), ("b", "winograd", 2), ("c", "winograd", 4))}
    counts = dict.fromkeys(ops, 0)
    real = {label: op.run_blocked for label, op in ops.items()}
    clock = {"t": 0.0}
    cost = {"a": [1.0, 5.0, 1.0], "b": [1.1], "c": [10.0]}  # a: one slow call in three
    for label, op in ops.items():
        def run(*args, label=label, **kw):
            counts[label] += 1
            clock["t"] += cost[label][counts[label] % len(cost[label])]
            return real[label](*args, **kw)
        monkeypatch.setattr(op, "run_blocked", run)
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: clock["t"])
    seconds = autotune.time_candidates(ops, budget=100.0)
    assert seconds == pytest.approx({"a": 1.0, "b": 1.1, "c": 10.0})
    assert counts["c"] == 1 + autotune.ROUNDS_MIN and counts["a"] > counts["c"] and counts["b"] == counts["a"]


# The shortest one-block (16-channel) direct tile each ISA's registers cannot hold: AVX2's 16 ymm
# registers take 7*2 accumulators + 2 B vectors + a broadcast = 17; AVX-512's 32 zmm registers,
# with the broadcast folded into the FMA, take 32 accumulators + 1 B vector = 33.
TOO_TALL = {"avx2": 7, "avx512": 32}


@pytest.mark.parametrize("mr", [TOO_TALL[ISA.name], 100, 10**30], ids=["first-too-tall", "100", "1e30"])
def test_a_measured_tile_the_registers_cannot_hold_is_ignored_with_a_warning(tmp_path, monkeypatch, caplog, rng, mr):
    """A tuned.json naming this host whose direct choice for the layer has a tile MR this ISA
    cannot hold (the first too tall for its registers, 100, 10**30; on a 56-wide map, so every
    row's tiles are at least that tall or 56 wide, which no x86 ISA holds either): the op is
    built on the rules' plan, computes the layer, and a warning names the entry and the value.
    Such a file raised TileError from the build instead."""
    layer = dict(data_shape=(1, 16, 56, 56), weight_shape=(16, 16, 3, 3), padding=1)
    conv = params(**layer)
    where = tmp_path / "tuned.json"
    monkeypatch.setenv(tuned.ENV, str(where))
    choice = {"algorithm": "direct", "mr": mr, "blocks": 1, "band_rows": 56, "band_parallel": False}
    tuned.save({"layers": [{"isa": ISA.name, "layer": dispatch.layer_key(conv), "threads": 1, "choice": choice,
                            "seconds": {"direct": 1e-3}}]})
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.autotune"):
        op = schedules.conv2d(**layer, threads=1)
    assert op.plan.source == "defaults", op.plan
    assert "ignoring the measured plan" in caplog.text and f"'mr': {mr}" in caplog.text, caplog.text
    assert "registers" in caplog.text and "rules' plan" in caplog.text, caplog.text
    x = rng.standard_normal(conv.data_shape, np.float32)
    w = rng.standard_normal(conv.weight_shape, np.float32)
    np.testing.assert_allclose(op(x, w), ref_conv2d(x, w, padding=1), rtol=1e-4, atol=1e-3)
