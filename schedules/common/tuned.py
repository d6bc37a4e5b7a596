"""What `python -m microkernels tune` measured on this host, read by the planners in place of
their shipped constants (which were measured once, on one machine).

The file: $TVM_MICROKERNELS_TUNE (a path; "off" ignores any), else tuned.json in the compile
cache's folder ($XDG_CACHE_HOME/tvm-microkernels or ~/.cache/tvm-microkernels). Its "host"
entry names the machine it was measured on: CPU model, a digest of its feature flags, core
count and this project's version. A file for another host or version, or one that does not
parse, is ignored with one warning, and the planners use their defaults. An entry that holds a
plan the operator cannot take (a hand-edited matmul tile or layer choice; the operator's own
tile checks decide) is ignored with a warning, and that planner uses its rules.

What the planners take from it (each falls back on its constant where the file lacks it):
- "matmul_tiles": {isa: [[MR, NR, share of the FMA peak], ...]}, the L1-resident tile rates
  that matmul's cost model weighs (microkernels.MATMUL_TILES' third column);
- "pack_flops_per_lane": {isa: what packing one element costs in FLOPs per lane}
  (matmul.PACK_FLOPS_PER_LANE), from the measured read bandwidth and FMA peak;
- "winograd": [{"isa", "c", "hw", "seconds": {"direct", "2", "4", "6"}}, ...]: one thread,
  warm, a 3x3 stride-1 layer of c channels in and out on an hw x hw map, each algorithm timed;
  algorithm="auto" takes the fastest of the nearest measured layer (winograd.choose);
- "layers": [{"isa", "layer", "threads", "choice", "seconds"}, ...]: one layer's candidate
  plans timed on this host (conv2d(..., autotune=True), optimize(..., autotune=True) or
  `tune --autotune TABLE`), keyed by the layer's shapes and parameters (conv.dispatch.layer_key) and
  the threads it runs on; algorithm="auto" takes its "choice" ({"algorithm": "direct", "mr",
  "blocks", "band_rows", "band_parallel"}, {"algorithm": "winograd", "tile"} or
  {"algorithm": "depthwise", "step", "band_rows"}) over any rule.
Nothing here measures: an operator call never tunes unless asked to (autotune=True). With
$TVM_MICROKERNELS_TUNE=off, what autotune measures is kept for this process only.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
from importlib import metadata
from pathlib import Path
from typing import Callable

from microkernels.isa import host_cpu_flags, host_cpuinfo

from . import files

LOG = logging.getLogger("tvm_microkernels.tuned")
ENV = "TVM_MICROKERNELS_TUNE"
FORMAT = 1
LAYER_ALGORITHMS = ("direct", "winograd", "depthwise")  # the families a "layers" choice may name


def path() -> Path | None:
    """Where the measurements are read from and written to; None when turned off."""
    return files.from_env(ENV, files.user_folder() / "tuned.json")


def version() -> str:
    try:
        return metadata.version("tvm-microkernels")
    except metadata.PackageNotFoundError:
        return "unknown"


def host() -> dict:
    """The identity a measurement file must carry to be used on this host."""
    info = host_cpuinfo()
    flags = " ".join(sorted(host_cpu_flags() or ()))
    return {"format": FORMAT, "cpu": info.get("model name", "unknown"),
            "family_model": f"{info.get('cpu family', '?')}/{info.get('model', '?')}",
            "flags": hashlib.sha256(flags.encode()).hexdigest()[:16], "cores": os.cpu_count(),
            "version": version()}


def save(data: dict, where: Path | None = None) -> Path:
    """Write `data` (the measurements) with this host's identity, atomically, over the file's
    measurements of this host for other ISAs, which are kept (the per-ISA entries merge)."""
    where = where or path()
    if where is None:
        raise ValueError(f"{ENV}=off: nowhere to write the measurements")
    old = _read(where) or {}
    new = data
    data = {**old, **new}
    for per_isa in ("matmul_tiles", "pack_flops_per_lane"):
        data[per_isa] = {**old.get(per_isa, {}), **new.get(per_isa, {})}
    remeasured = {r.get("isa") for r in new.get("winograd", ())}
    data["winograd"] = [r for r in old.get("winograd", []) if r.get("isa") not in remeasured] + \
        list(new.get("winograd", []))
    retimed = {_layer_id(r) for r in new.get("layers", ())}
    data["layers"] = [r for r in old.get("layers", []) if _layer_id(r) not in retimed] + list(new.get("layers", []))
    files.write_atomic(where, json.dumps({**data, "host": host()}, indent=1, sort_keys=True).encode())
    load.cache_clear()
    return where


_IGNORING = False  # inside ignored()
# Layers autotune timed while the file is turned off (or ignored): this process's only.
_MEMORY: dict[tuple, dict] = {}


@contextlib.contextmanager
def ignored():
    """Plans made inside take the shipped defaults, as if nothing had been measured (and
    autotune keeps what it measures in this process): to compare the two in one run."""
    global _IGNORING, _MEMORY
    before, memory = _IGNORING, _MEMORY
    _IGNORING, _MEMORY = True, {}
    try:
        yield
    finally:
        _IGNORING, _MEMORY = before, memory


def current() -> dict | None:
    """This host's measurements, or None (no file, turned off, not this host's, or ignored)."""
    where = None if _IGNORING else path()
    return None if where is None else _read(where)


def _read(where: Path) -> dict | None:
    try:
        stat = where.stat()
    except OSError:
        return None
    return load(str(where), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def load(where: str, _mtime: int, _size: int) -> dict | None:
    """The file's measurements if it parses and names this host; else None, with a warning.
    Keyed by modification time and size, so a file rewritten by `tune` is read again."""
    try:
        data = json.loads(Path(where).read_text())
    except (OSError, ValueError) as e:
        LOG.warning("ignoring the measurements in %s: unreadable (%s); using the shipped defaults", where, e)
        return None
    if not isinstance(data, dict) or data.get("host") != host():
        theirs = data.get("host") if isinstance(data, dict) else None
        LOG.warning("ignoring the measurements in %s: made for %s, this is %s; run `python -m microkernels tune` "
                    "again", where, theirs, host())
        return None
    problem = _problem(data)
    if problem:
        LOG.warning("ignoring the measurements in %s: %s; using the shipped defaults", where, problem)
        return None
    return data


def _problem(data: dict) -> str | None:
    """What makes `data` unusable by the planners (a hand-edited or truncated file), or None."""
    positive = lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0
    count = lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0
    tiles = data.get("matmul_tiles", {})
    if not isinstance(tiles, dict) or not all(
            isinstance(t, list) and all(isinstance(e, list) and len(e) == 3 and count(e[0]) and count(e[1])
                                        and positive(e[2]) for e in t) for t in tiles.values()):
        return "matmul_tiles is not {isa: [[MR, NR, share], ...]}"
    pack = data.get("pack_flops_per_lane", {})
    if not isinstance(pack, dict) or not all(positive(v) for v in pack.values()):
        return "pack_flops_per_lane is not {isa: FLOPs}"
    for r in data.get("winograd", []) if isinstance(data.get("winograd", []), list) else [None]:
        ok = isinstance(r, dict) and isinstance(r.get("isa"), str) and count(r.get("c")) and count(r.get("hw")) \
            and count(r.get("threads", 1))
        for k in ("seconds", "seconds_network"):
            times = r.get(k, {}) if ok else None
            ok = ok and isinstance(times, dict) and all(
                (key == "direct" or key in ("2", "4", "6")) and positive(v) for key, v in times.items())
        if not ok:
            return f"a winograd entry is not {{isa, c, hw, threads, seconds: {{direct|2|4|6: s}}}}: {r!r}"
    for r in data.get("layers", []) if isinstance(data.get("layers", []), list) else [None]:
        ok = isinstance(r, dict) and isinstance(r.get("isa"), str) and isinstance(r.get("layer"), str) \
            and count(r.get("threads")) and isinstance(r.get("choice"), dict) \
            and r["choice"].get("algorithm") in LAYER_ALGORITHMS and isinstance(r.get("seconds"), dict) \
            and all(positive(v) for v in r["seconds"].values())
        if not ok:
            return f"a layers entry is not {{isa, layer, threads, choice: {{algorithm, ...}}, seconds}}: {r!r}"
    return None


def fingerprint() -> str:
    """A digest of the measurements in force ("none" without): part of the compile cache's keys."""
    data = current()
    if _MEMORY:
        data = {**(data or {}), "this process": sorted(_MEMORY.values(), key=lambda r: json.dumps(r, sort_keys=True))}
    return "none" if data is None else hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def source() -> str:
    """What a plan says it came from when it read the measurements."""
    return f"tuned ({path()})"


def matmul_tiles(isa_name: str, check: Callable[[int, int], object] | None = None) -> tuple | None:
    """((MR, NR, share), ...) measured for the ISA, or None. check(MR, NR): the operator's own
    test of a tile (schedules.matmul builds its kernel), raising ValueError where it cannot take
    it; one such tile (a hand-edited file) sets the ISA's whole list aside, with one warning,
    and the planner weighs the shipped tiles instead."""
    data = current() or {}
    tiles = (data.get("matmul_tiles") or {}).get(isa_name)
    if not tiles:
        return None
    tiles = tuple((int(mr), int(nr), float(share)) for mr, nr, share in tiles)
    for mr, nr, _ in tiles if check else ():
        try:
            check(mr, nr)
        except ValueError as e:
            _warn_once(f"ignoring the measured matmul_tiles[{isa_name!r}] in {path()}: the {mr}x{nr} tile cannot "
                       f"run ({e}); using the shipped tiles instead")
            return None
    return tiles


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    """A warning about the file, once per process: the planners read the file on every plan."""
    if message not in _WARNED:
        _WARNED.add(message)
        LOG.warning("%s", message)


def pack_flops_per_lane(isa_name: str) -> float | None:
    value = ((current() or {}).get("pack_flops_per_lane") or {}).get(isa_name)
    return float(value) if value else None


def _layer_id(r: dict) -> tuple:
    return r.get("isa"), r.get("layer"), r.get("threads")


def layer(isa_name: str, key: str, threads: int) -> dict | None:
    """The layer's timed entry ({"choice", "seconds", "source": what a plan names}) for this
    ISA and thread count, or None."""
    found = _MEMORY.get((isa_name, key, threads))
    if found is not None:
        return {**found, "source": "autotuned (this process)"}
    found = next((r for r in (current() or {}).get("layers", []) if _layer_id(r) == (isa_name, key, threads)), None)
    return None if found is None else {**found, "source": source()}


def save_layer(isa_name: str, key: str, threads: int, choice: dict, seconds: dict) -> None:
    """Keep what autotune measured on a layer: in the file, or in this process where the file
    is turned off."""
    entry = {"isa": isa_name, "layer": key, "threads": threads, "choice": choice,
             "seconds": {k: float(v) for k, v in seconds.items()}}
    if path() is None or _IGNORING:
        _MEMORY[_layer_id(entry)] = entry
        return
    save({"layers": [entry]})


def winograd_layers(isa_name: str) -> list[dict]:
    """The measured 3x3 stride-1 layers of this ISA: [{"c", "hw", "seconds": {alg: s}}]."""
    return [r for r in (current() or {}).get("winograd", []) if r.get("isa") == isa_name]
