"""The benchmarks' one harness: the timer, alternating rounds, the flags, the result files.

Every script in this directory times with `time_it` (or `alternating`, which calls it),
reads its command line with `arguments`, and writes its table with `publish` (which
prints it and `save`s it):

    args = arguments(__doc__, flag("--blocks", type=int, default=60, dest="rounds"))
    timings = alternating({"floor": floor, "jaxbind": ours}, rounds=args.rounds, iters=400)
    lines = table(caption, ("case", "floor", "jaxbind"), [(r["case"], ...) for r in rows])
    publish(args.out, "overhead", dict(meta=run_meta(), results=rows), lines)

A script's results directory holds what `save` writes (<stem>.json: the metadata and the
raw results; <stem>.md: the table the docs quote); hand-written analyses of those results
live apart, in analyses/ (tests/test_benchmarks_smoke.py checks both rules).
It imports no JAX: run.py drives workers that do, and `time_it` waits for JAX's arrays
only where JAX is loaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

RESULTS = pathlib.Path(__file__).parent / "results"

clock = time.perf_counter
"""The one clock, for what is not a call to time (gaps between a thread's ticks, a
callable's own share of a call); calls are timed with `time_it`."""


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds per call, one sample per round (wall clock, and this process's CPU time),
    and the value the last call returned (for chained calls, and results to check)."""

    samples: tuple[float, ...]
    cpu: tuple[float, ...]
    value: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


def _wait(value: Any) -> Any:
    jax = sys.modules.get("jax")
    return value if jax is None else jax.block_until_ready(value)


def time_it(
    fn: Callable[[], Any],
    *,
    iters: int = 1,
    warmup: int = 1,
    rounds: int = 1,
    sync: Callable[[], Any] | None = None,
) -> Timing:
    """Time `fn()`: `warmup` untimed calls, then `rounds` rounds of `iters` calls each.

    A round's sample is its time divided by `iters`; a round ends when its work is done:
    `sync()` if given (e.g. CuPy's device synchronize), else when the value of its last
    call is ready (JAX's arrays are waited for, so asynchronous dispatch is counted).
    """
    done = (lambda value: (sync(), value)[1]) if sync is not None else _wait
    value = None
    for _ in range(warmup):
        value = done(fn())
    samples, cpu = [], []
    for _ in range(rounds):
        start, start_cpu = clock(), time.process_time()
        for _ in range(iters):
            value = fn()
        value = done(value)
        samples.append((clock() - start) / iters)
        cpu.append((time.process_time() - start_cpu) / iters)
    return Timing(tuple(samples), tuple(cpu), value)


def alternation(names: Iterable[Any], rounds: int) -> Iterator[Any]:
    """The names, round by round in alternating order (A B C, C B A, A B C, ...): so that
    what ran just before favours no one. `alternating` times callables in this order; a
    runner that asks worker processes for its times walks it itself."""
    names = list(names)
    for r in range(rounds):
        yield from names if r % 2 == 0 else reversed(names)


def alternating(
    variants: dict[Any, Callable[[], Any]],
    *,
    rounds: int,
    iters: int | dict[Any, int] = 1,
    warmup: int = 0,
    best_of: int = 1,
) -> dict[Any, Timing]:
    """Time the variants side by side, each once per round in `alternation`'s order, so all
    see the same machine state. A variant's sample for a round is the best of `best_of`
    `time_it` rounds of `iters` calls (after `warmup` untimed calls); samples stay in round
    order, so two variants' samples pair up (``zip(a.samples, b.samples)``). `iters` may
    be a dict: calls per round of each variant."""
    samples: dict[Any, list[Timing]] = {name: [] for name in variants}
    for name in alternation(variants, rounds):
        n = iters[name] if isinstance(iters, dict) else iters
        samples[name].append(time_it(variants[name], iters=n, warmup=warmup, rounds=best_of))
    return {
        name: Timing(
            tuple(t.min for t in ts),
            tuple(min(t.cpu) for t in ts),
            ts[-1].value if ts else None,
        )
        for name, ts in samples.items()
    }


def medians(variants: dict[Any, Callable[[], Any]], *, rounds: int, **options: Any) -> dict:
    """Each variant's median seconds per call over `alternating` rounds (`options`: its
    iters, warmup, best_of)."""
    return {name: t.median for name, t in alternating(variants, rounds=rounds, **options).items()}


def side_by_side(
    variants: dict[Any, Callable[[], Any]], *, rounds: int, against: Any, **options: Any
) -> tuple[dict, dict]:
    """Two or more implementations of one thing, compared: each variant's result (its first
    call, which compiles and warms up), then per variant its median seconds over
    `alternating` rounds (`options`: iters, warmup, best_of) and the relative difference of
    its result from `against`'s."""
    results = {name: _wait(fn()) for name, fn in variants.items()}
    times = medians(variants, rounds=rounds, **options)
    return times, {name: relative_difference(r, results[against]) for name, r in results.items()}


def relative_difference(got: Any, want: Any) -> float:
    """The relative l2 difference of `got` from `want` (arrays, or pytrees of them: the
    largest over their leaves, in order)."""
    import numpy as np

    jax = sys.modules.get("jax")
    leaves = (lambda t: jax.tree.leaves(t)) if jax is not None else (lambda t: [t])
    return max(
        float(np.linalg.norm(np.asarray(g) - np.asarray(w)) / np.linalg.norm(np.asarray(w)))
        for g, w in zip(leaves(got), leaves(want))
    )


HIDDEN = argparse.SUPPRESS
"""A flag's help that keeps it out of --help (one a script passes to its own children)."""


def flag(*names: str, **options: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    """One flag of a script's own, for `arguments`: argparse's add_argument's arguments."""
    return names, options


def arguments(
    doc: str | None,
    *flags: tuple[tuple[str, ...], dict[str, Any]],
    out: pathlib.Path | None = RESULTS,
    rounds: int | None = None,
) -> argparse.Namespace:
    """The command line of every benchmark: ``--quick`` (small sizes, few rounds; the
    smoke test), ``--rounds`` (default `rounds`; None: the script's own choice), ``--out``
    (the results directory, default `out`), plus the script's own `flags`; `doc` is the
    help."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    parser.add_argument("--rounds", type=int, default=rounds, help="timed rounds")
    parser.add_argument("--out", default=None if out is None else str(out), help="results dir")
    for names, options in flags:
        parser.add_argument(*names, **options)
    return parser.parse_args()


def run_meta(**extra: Any) -> dict:
    """When, where and with which Python and JAX a run was made, plus `extra`."""
    import jax  # here: run.py writes with this module but runs JAX only in its workers

    return dict(
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        machine=f"{platform.machine()} {os.cpu_count()} cores",
        python=sys.version.split()[0],
        jax=jax.__version__,
        **extra,
    )


def run_line(meta: dict) -> str:
    """The opening of a results table's caption: "Run <date> on <machine>: Python .., jax .."."""
    return f"Run {meta['date']} on {meta['machine']}: Python {meta['python']}, jax {meta['jax']}"


def save(out_dir: str | pathlib.Path, stem: str, payload: dict, text: str) -> None:
    """Write `payload` (raw results) to <out_dir>/<stem>.json and `text` to <stem>.md."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=1))
    (out / f"{stem}.md").write_text(text)


def ms(seconds: float, digits: int = 3) -> str:
    """Seconds as milliseconds, for a table's cell."""
    return f"{seconds * 1e3:.{digits}f} ms"


def us(seconds: float, digits: int = 2) -> str:
    """Seconds as microseconds, for a table's cell."""
    return f"{seconds * 1e6:.{digits}f} µs"


def table(caption: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A results table in markdown, as lines: `caption` (the run and how it was measured),
    a blank line, the `header`, its rule, and one line per row of cells."""
    return [
        caption,
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows),
    ]


def publish(
    out_dir: str | pathlib.Path | None,
    stem: str,
    payload: dict,
    lines: Sequence[str],
    *,
    write: bool = True,
) -> str:
    """The results of a run: `lines` (tables from `table`, and any text) printed and, with
    `write` (not a ``--quick`` run, say) and an `out_dir`, saved with the raw `payload` as
    <stem>.md and <stem>.json (`save`). Returns the text."""
    text = "\n".join(lines) + "\n"
    print(text)
    if write and out_dir is not None:
        save(out_dir, stem, payload, text)
    return text
