"""Stable GPU timing for the benchmarks: the median of many repeats, with its spread.

One figure = warm-up calls (module loads, Triton/compile work, allocator growth stay out), then repeats
timed one by one with CUDA events until BOTH minima hold: at least ``min_reps`` repeats and at least
``min_seconds`` of timed work. A 280 ms training step is then timed >= 20 times (>= 5.6 s), a 100 µs
quantizer ~20 000 times (2 s). Repeats are launched back to back in chunks and the host waits once per
chunk, so the GPU queue never drains between repeats and the host's waiting is not timed.

The stopping rule is separate from the clock (``run_chunk``), so it is tested on the CPU with a fake clock.
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

#: the project's benchmark floor: a figure is the median of at least this many repeats and this much timed work
MIN_REPS, MIN_SECONDS = 20, 2.0
#: a chunk runner: calls ``fn`` ``k`` times and returns each call's duration in seconds
ChunkRunner = Callable[[Callable[[], object], int], list]


@dataclass(frozen=True)
class Timing:
    """One benchmark figure: median and spread (milliseconds) of ``n`` repeats totalling ``total_s`` seconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    max_ms: float
    n: int
    total_s: float
    warmup_n: int

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative spread quoted next to the figure."""
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms > 0 else float("nan")

    def as_dict(self) -> dict:
        """The JSON form (what every figure of ``benchmarks/bench.py`` records)."""
        return {**asdict(self), "spread": self.spread}


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs`` by linear interpolation between order statistics (numpy's default)."""
    if len(xs) == 0:
        raise ValueError("percentile of no values")
    return float(np.percentile(xs, 100.0 * q))


def cuda_event_chunk(fn: Callable[[], object], k: int) -> list:
    """Run ``fn`` ``k`` times back to back, a CUDA event pair around each call; wait once at the end."""
    import torch

    events = [torch.cuda.Event(enable_timing=True) for _ in range(k + 1)]
    events[0].record()
    for i in range(k):
        fn()
        events[i + 1].record()
    events[-1].synchronize()
    return [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(k)]


def time_callable(fn: Callable[[], object], *, min_reps: int = MIN_REPS, min_seconds: float = MIN_SECONDS, warmup_reps: int = 3,
                  warmup_seconds: float = 0.2, max_reps: int = 200_000, max_chunk_seconds: float = 0.5,
                  run_chunk: ChunkRunner | None = None) -> Timing:
    """Time ``fn`` (see the module docstring): warm up, then repeat until ``min_reps`` AND ``min_seconds`` hold.

    Warm-up: at least ``warmup_reps`` calls and ``warmup_seconds`` of work, discarded. Timed repeats run in chunks
    sized from the durations seen so far (at most ~``max_chunk_seconds`` each, so a slow first estimate cannot run
    far past the minima); ``max_reps`` caps the repeats of a callable that takes no measurable time.
    """
    if min_reps < 1 or min_seconds < 0:
        raise ValueError("min_reps must be >= 1 and min_seconds >= 0")
    run = run_chunk or cuda_event_chunk
    warm: list = []
    while len(warm) < warmup_reps or sum(warm) < warmup_seconds:
        warm += run(fn, 1 if not warm else _chunk(warm, warmup_reps - len(warm), warmup_seconds - sum(warm),
                                                  max_chunk_seconds, max_reps))
        if len(warm) >= max_reps:
            break
    times: list = []
    while len(times) < min_reps or sum(times) < min_seconds:
        if len(times) >= max_reps:
            break
        k = _chunk(times or warm, min_reps - len(times), min_seconds - sum(times), max_chunk_seconds,
                   max_reps - len(times))
        times += run(fn, k)
    return _summary(times, len(warm))


def _summary(times: list, warmup_n: int) -> Timing:
    """The figure of timed repeats (durations in seconds): median, p10/p90, extremes, count, seconds timed."""
    ms = [t * 1e3 for t in times]
    return Timing(median_ms=statistics.median(ms), p10_ms=percentile(ms, 0.1), p90_ms=percentile(ms, 0.9),
                  min_ms=min(ms), max_ms=max(ms), n=len(ms), total_s=sum(times), warmup_n=warmup_n)


def time_interleaved(fns: dict[str, Callable[[], object]], *, min_reps: int = MIN_REPS, min_seconds: float = MIN_SECONDS,
                     warmup_reps: int = 3, chunk_seconds: float = 0.2, settle_seconds: float = 0.1,
                     max_rounds: int = 100_000, seed: int = 0,
                     run_chunk: ChunkRunner | None = None) -> dict[str, Timing]:
    """Time several variants of one piece of work *interleaved*: round after round, each variant in turn (a new
    random order every round) runs ``settle_seconds`` untimed and then a ``chunk_seconds`` slice timed, until every
    variant has ``min_reps`` repeats and ``min_seconds`` of timed work (the module's rule).

    Why: the kernels compared here are instruction-bound, so their speed follows the SM clock, and an H100 at its
    power cap moves that clock by ~40% within seconds (1350 vs 1980 MHz were seen a section apart). Timing variant A
    to completion and then B compares clock histories as much as code; slices in turn put every variant under the
    same slow drift. The settling run and the shuffled order are there because the clock also carries over from
    one slice to the next: with short slices in a fixed order, the variant that always follows a power-hungry one
    (BF16's GEMMs) is timed at a clock that one left behind (measured: docs/kernels.md, tuning table)."""
    if not fns:
        raise ValueError("time_interleaved needs at least one callable")
    if min_reps < 1 or min_seconds < 0:
        raise ValueError("min_reps must be >= 1 and min_seconds >= 0")
    run = run_chunk or cuda_event_chunk
    per = {}
    for name, fn in fns.items():  # warm-up (JIT, compile, allocator growth), and a first duration for the chunk size
        per[name] = max(statistics.median(run(fn, warmup_reps)), 1e-7)
    times: dict[str, list] = {name: [] for name in fns}
    warm = {name: warmup_reps for name in fns}
    order = list(fns)
    rng = random.Random(seed)
    for _ in range(max_rounds):
        if all(len(t) >= min_reps and sum(t) >= min_seconds for t in times.values()):
            break
        rng.shuffle(order)
        for name in order:
            fn = fns[name]
            if settle_seconds > 0:
                warm[name] += len(run(fn, max(1, math.ceil(settle_seconds / per[name]))))
            times[name] += run(fn, max(1, math.ceil(chunk_seconds / per[name])))
    return {name: _summary(t, warm[name]) for name, t in times.items()}


def _chunk(seen: list, reps_left: int, seconds_left: float, max_chunk_seconds: float, cap: int) -> int:
    """Repeats in the next chunk: enough for both minima by the median duration seen, at most ~max_chunk_seconds."""
    per = max(statistics.median(seen), 1e-7)
    need = max(reps_left, math.ceil(max(seconds_left, 0.0) / per), 1)
    return int(max(1, min(need, math.ceil(max_chunk_seconds / per), cap)))


def input_sets(bytes_per_set: int, l2_bytes: int, max_sets: int = 16) -> int:
    """How many distinct input sets to rotate among so that repeats do not run from the L2 cache.

    One set when a set is at least twice the L2 (the next repeat's inputs were evicted); otherwise enough
    sets to span twice the L2, capped at ``max_sets``."""
    if bytes_per_set <= 0:
        raise ValueError("bytes_per_set must be positive")
    if bytes_per_set >= 2 * l2_bytes:
        return 1
    return min(max_sets, math.ceil(2 * l2_bytes / bytes_per_set))


def rotating(fns: Sequence[Callable[[], object]]) -> Callable[[], object]:
    """One callable that calls ``fns[0]``, ``fns[1]``, ... in turn (one per input set)."""
    if not fns:
        raise ValueError("rotating needs at least one callable")
    fns = list(fns)
    i = [0]

    def call():
        f = fns[i[0] % len(fns)]
        i[0] += 1
        return f()

    return call
