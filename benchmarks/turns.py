"""Engines timed side by side: they take turns, round after round, so a drift of the shared
machine's speed lands on all of them, and each keeps its best round."""

from __future__ import annotations

from schedules.common.targets import set_threads
from schedules.common.timing import seconds_per_call, settle


def take_turns(turns: dict, threads: int, number: int, repeat: int, pause: float, ours: tuple,
               rounds: int) -> dict:
    """Seconds per call of each engine in `turns` (name -> call): `rounds` rounds of turns, each
    engine's best median kept, a settling pause of `pause` s before each turn; the engines named
    in `ours` run on TVM's pool, sized to `threads` before each of their turns."""
    secs = {}
    for _ in range(rounds):
        for name, call in turns.items():
            settle(threads, pause)
            if name in ours:
                set_threads(threads)
            s = seconds_per_call(call, number, repeat, cold=False)
            secs[name] = min(secs.get(name, s), s)
    return secs
