"""This host's measurements (schedules/common/tuned.py): written and read back; a file for
another host or version, or a corrupt one, ignored with a warning; the planners following a
made-up table (matmul's tile, Winograd's auto choice) and saying so in their plan; the compile
cache's keys changing with the table. The suite runs with measurements off (conftest); these
tests point TVM_MICROKERNELS_TUNE at files of their own."""

import importlib
import json
import logging

import numpy as np
import pytest

import schedules
import microkernels as MICROKERNELS
from microkernels import ISAS
from schedules.common import cache, tuned
from schedules.conv import winograd
from schedules.conv.geometry import ConvParams, Geometry

from ...conv_reference import ref_conv2d
from ...x86_exec import HOST

ISA = HOST[4:]
MATMUL = importlib.import_module("schedules.matmul")  # the module: schedules.matmul is the function


def times(fastest: str) -> dict:
    """Seconds per algorithm of a measured layer where `fastest` wins by a factor of two."""
    return {k: (1e-3 if k == fastest else 2e-3) for k in ("direct", "2", "4", "6")}


@pytest.fixture
def table(tmp_path, monkeypatch):
    """Write measurements for this host to a file of the test's own and return the writer."""
    where = tmp_path / "tuned.json"
    monkeypatch.setenv(tuned.ENV, str(where))

    def write(**data):
        return tuned.save(data)

    return write


def test_written_and_read_back(table):
    where = table(matmul_tiles={ISA: [[4, 48, 0.9]]}, pack_flops_per_lane={ISA: 3.0})
    assert tuned.current()["host"] == tuned.host() and tuned.source() == f"tuned ({where})"
    assert tuned.matmul_tiles(ISA) == ((4, 48, 0.9),) and tuned.pack_flops_per_lane(ISA) == 3.0


def test_another_isas_measurements_are_kept(table):
    """tune --target x86-avx2 after the AVX-512 run adds to the file instead of replacing it."""
    table(matmul_tiles={"avx512": [[8, 32, 0.95]]}, pack_flops_per_lane={"avx512": 2.0},
          winograd=[{"isa": "avx512", "c": 64, "hw": 56, "seconds": {"direct": 1.0}}])
    table(matmul_tiles={"avx2": [[6, 16, 0.9]]}, pack_flops_per_lane={"avx2": 4.0},
          winograd=[{"isa": "avx2", "c": 64, "hw": 56, "seconds": {"direct": 2.0}}])
    assert tuned.matmul_tiles("avx512") == ((8, 32, 0.95),) and tuned.matmul_tiles("avx2") == ((6, 16, 0.9),)
    assert tuned.pack_flops_per_lane("avx512") == 2.0 and tuned.pack_flops_per_lane("avx2") == 4.0
    assert [r["seconds"]["direct"] for r in tuned.winograd_layers("avx512") + tuned.winograd_layers("avx2")] == [1.0, 2.0]
    table(winograd=[{"isa": "avx2", "c": 64, "hw": 56, "seconds": {"direct": 3.0}}])  # measured again: replaced
    assert [r["seconds"]["direct"] for r in tuned.winograd_layers("avx2")] == [3.0]
    table(pack_flops_per_lane={"avx2": 5.0})  # a write without layers keeps them
    assert len(tuned.winograd_layers("avx512") + tuned.winograd_layers("avx2")) == 2


@pytest.mark.parametrize("field, value", [("cpu", "Some Other CPU"), ("cores", 999), ("version", "0.0.0-other"),
                                          ("flags", "0" * 16)])
def test_another_hosts_file_is_ignored_with_a_warning(table, field, value, caplog):
    where = table(matmul_tiles={ISA: [[4, 48, 0.9]]})
    data = json.loads(where.read_text())
    data["host"][field] = value
    where.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.tuned"):
        assert tuned.current() is None and tuned.matmul_tiles(ISA) is None
    assert "made for" in caplog.text and "tune" in caplog.text


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", ""])
def test_a_corrupt_file_is_ignored_with_a_warning(table, text, caplog):
    where = table()
    where.write_text(text)
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.tuned"):
        assert tuned.current() is None
    assert "ignoring the measurements" in caplog.text
    assert MATMUL.rates(ISAS[ISA])[2] == "defaults"


@pytest.mark.parametrize("data", [
    {"matmul_tiles": {ISA: [[8, 32]]}},
    {"matmul_tiles": {ISA: [[0, 32, 1.0]]}},
    {"pack_flops_per_lane": {ISA: -1}},
    {"winograd": [{"isa": ISA, "c": 64, "seconds": {"direct": 1e-3}}]},
    {"winograd": [{"isa": ISA, "c": 64, "hw": 56, "seconds": {"direct": 1e-3, "5": 1e-3}}]},
    {"winograd": [{"isa": ISA, "c": 64, "hw": 56, "seconds": {"direct": "fast"}}]},
    {"winograd": "all of them"},
    {"layers": [{"isa": ISA, "layer": "1x16x8x8", "threads": 1, "choice": {"algorithm": "fft"}, "seconds": {}}]},
    {"layers": [{"isa": ISA, "layer": "1x16x8x8", "threads": 0, "choice": {"algorithm": "direct"}, "seconds": {}}]},
    {"layers": {"1x16x8x8": "direct"}},
], ids=["tile-without-share", "zero-rows", "negative-pack", "no-map-side", "no-such-tile", "text-seconds",
        "not-a-list", "layer-no-such-algorithm", "layer-zero-threads", "layers-not-a-list"])
def test_a_file_the_planners_cannot_use_is_ignored_with_a_warning(table, data, caplog):
    """A hand-edited file that still names this host: refused whole, before a planner trips on it."""
    where = table()
    stored = json.loads(where.read_text())
    where.write_text(json.dumps({**stored, **data}))
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.tuned"):
        assert tuned.current() is None
    assert "ignoring the measurements" in caplog.text
    g = Geometry.of(ConvParams((1, 16, 56, 56), (16, 16, 3, 3), padding=1))
    assert winograd.choose(g, ISA)[::2] == (4, "defaults") and MATMUL.rates(ISAS[ISA])[2] == "defaults"


def test_off_reads_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(tuned.ENV, "off")
    assert tuned.path() is None and tuned.current() is None and tuned.fingerprint() == "none"
    with pytest.raises(ValueError, match="off"):
        tuned.save({})


def test_matmul_takes_the_tile_the_measurements_favour(table):
    """Every tile but one measured at a third of peak: the planner picks that one, and the plan
    says where its rates came from. The result is the same matmul."""
    isa = ISAS[ISA]
    default = MATMUL.plan(96, 256, 256, isa)
    assert default.source == "defaults"
    candidates = MATMUL.rates(isa)[0]
    other = next((mr, nr) for mr, nr, _ in candidates if (mr, nr) != (default.kernel.mr, default.kernel.nr)
                 and 96 % mr == 0)
    table(matmul_tiles={ISA: [[mr, nr, 1.0 if (mr, nr) == other else 0.3] for mr, nr, _ in candidates]})
    tuned_plan = MATMUL.plan(96, 256, 256, isa)
    assert (tuned_plan.kernel.mr, tuned_plan.kernel.nr) == other and tuned_plan.source.startswith("tuned")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((96, 256), np.float32), rng.standard_normal((256, 256), np.float32)
    got = schedules.matmul(96, 256, 256, target=HOST)(a, b)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("fastest, want", [("direct", None), ("6", 6), ("2", 2)])
def test_winograd_auto_follows_the_nearest_measured_layer(table, fastest, want):
    """A 56x56 layer, which the shipped rule gives F(4): the measurements decide instead, from
    the nearest measured layer (56x56 at 64 channels, not the 7x7 one), and the op computes the
    same convolution."""
    table(winograd=[{"isa": ISA, "c": 64, "hw": 56, "seconds": times(fastest)},
                    {"isa": ISA, "c": 512, "hw": 7, "seconds": times("4")},
                    {"isa": "not-this-isa", "c": 32, "hw": 56, "seconds": times("4")}])
    g = Geometry.of(ConvParams((1, 32, 56, 56), (32, 32, 3, 3), padding=1))
    tile, reason, source = winograd.choose(g, ISA, 1)
    assert tile == want and source.startswith("tuned") and "64x56x56" in reason, reason
    op = schedules.conv2d((1, 32, 56, 56), (32, 32, 3, 3), padding=1, target=HOST, threads=1)
    assert op.plan.get("tile") == want and op.plan["source"] == source, op.plan
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 32, 56, 56), np.float32)
    w = rng.standard_normal((32, 32, 3, 3), np.float32)
    ref = ref_conv2d(x, w, padding=1)
    np.testing.assert_allclose(op(x, w), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_the_measurements_at_the_nearest_thread_count_decide(table):
    """Measured at 1 and 2 threads with different winners: a layer planned for 2 threads (or
    more) follows the 2-thread figures, one for 1 thread the 1-thread ones."""
    table(winograd=[{"isa": ISA, "c": 64, "hw": 56, "threads": 1, "seconds": times("6")},
                    {"isa": ISA, "c": 64, "hw": 56, "threads": 2, "seconds": times("2")}])
    g = Geometry.of(ConvParams((1, 64, 56, 56), (64, 64, 3, 3), padding=1))
    assert [winograd.choose(g, ISA, t)[0] for t in (1, 2, 8)] == [6, 2, 2]
    assert "2 thread(s)" in winograd.choose(g, ISA, 2)[1]


def test_the_rule_stays_where_nothing_was_measured(table):
    """Measurements for another ISA only: the shipped rule, said to be the defaults."""
    table(winograd=[{"isa": "not-this-isa", "c": 64, "hw": 56, "seconds": {"direct": 1e-3, "4": 2e-3}}])
    g = Geometry.of(ConvParams((1, 16, 56, 56), (16, 16, 3, 3), padding=1))
    assert winograd.choose(g, ISA)[::2] == (4, "defaults")


def test_the_cache_keys_change_with_the_measurements(table):
    before = cache.key("schedule", "layer")
    table(pack_flops_per_lane={ISA: 3.0})
    after = cache.key("schedule", "layer")
    table(pack_flops_per_lane={ISA: 4.0})
    assert len({before, after, cache.key("schedule", "layer")}) == 3


def test_ignored_plans_from_the_defaults_and_forgets_what_autotune_timed_inside(table):
    """tuned.ignored(): the file's measurements unseen inside (the benches compare the rules with
    the measurements in one run); what autotune keeps inside is this process's, and dropped
    on the way out."""
    where = table(winograd=[{"isa": ISA, "c": 16, "hw": 56, "seconds": times("2")}])
    g = Geometry.of(ConvParams((1, 16, 56, 56), (16, 16, 3, 3), padding=1))
    outside = tuned.fingerprint()
    with tuned.ignored():
        assert tuned.current() is None and winograd.choose(g, ISA)[::2] == (4, "defaults")
        assert tuned.fingerprint() == "none"
        tuned.save_layer(ISA, "a layer", 1, {"algorithm": "winograd", "tile": 2}, {"F(2)": 1e-3})
        assert tuned.layer(ISA, "a layer", 1)["source"] == "autotuned (this process)"
        assert not json.loads(where.read_text())["layers"]
    assert tuned.layer(ISA, "a layer", 1) is None and tuned.fingerprint() == outside
    assert winograd.choose(g, ISA)[::2] == (2, f"tuned ({where})")


@pytest.mark.parametrize("tile", [[99, 16], [6, 17], [1, 8]], ids=["too-tall", "nr-off-the-lanes", "one-row"])
def test_matmul_tiles_the_operator_cannot_take_are_ignored_with_a_warning(table, caplog, tile):
    """A file naming this host whose matmul_tiles hold a tile no x86 ISA's GEMM intrinsic takes
    (99 rows: more accumulators than any register file; NR = 17: not whole vectors of 8 or 16
    lanes; MR = 1: TIR drops the unit row loop, so no intrinsic matches, and on AVX-512 NR = 8 is
    half a vector): the shipped tiles are used, the matmul computes, and a warning names the
    entry, the tile and why. These raised TileError from schedules.matmul instead."""
    where = table(matmul_tiles={ISA: [[*tile, 1.0]]})
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.tuned"):
        op = schedules.matmul(99, 64, 32, target=HOST)
        assert MATMUL.rates(ISAS[ISA])[0] == MICROKERNELS.MATMUL_TILES[ISA]
    assert f"matmul_tiles[{ISA!r}]" in caplog.text and f"{tile[0]}x{tile[1]}" in caplog.text, caplog.text
    assert str(where) in caplog.text and "shipped tiles" in caplog.text, caplog.text
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((99, 32), np.float32), rng.standard_normal((32, 64), np.float32)
    np.testing.assert_allclose(op(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
