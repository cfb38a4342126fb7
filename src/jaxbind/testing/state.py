"""state: an op with ``state=`` (see docs/state.md), through a program of its own.

- **set up once per site**: JAX's caches cleared, a jitted program with two call sites
  of the op, run three times, sets its state up once (none if a program made before the
  check holds it) and uses one object ("lock", "shared"), or at most ``pool_size``
  ("pool");
- **fresh vs reused object**: that program's outputs, its object used five times
  already, against the function called directly with an object of its own;
- **two threads**: the program run from two threads at once, each on inputs of its own
  (the example inputs, each differentiable one scaled by a factor per thread), agrees
  with that thread's inputs run alone first; and no object is used by two calls at
  once unless the state is ``"shared"``;
- **teardowns equal setups**: every object set up during the check is torn down once
  ``jax.clear_caches()`` has freed the programs that use it. Where a program outside
  JAX's caches (compiled or exported before the check, and kept) still holds the state,
  the row is "not checked" and names the op and role of the sites that hold it;
- **teardown runs**, for a state with ``teardown=``: no teardown raised, in the check's
  programs or after its direct calls (a teardown's failure is its own row: the calls
  before it did not fail).

It runs last: it clears JAX's caches, twice (jitted functions compile again afterwards).
A compiled kernel uses its state in C++, where the check cannot see which object a call
used: its rows compare outputs and count setups only.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator

import jax
import numpy as np

from .._roles import Body
from .._state import Watch
from .case import Case, Family, needs_f, rel
from .report import CheckResult, not_checked

_RUNS = 3  # runs of the program, each with two call sites
_THREAD_RUNS = 6  # runs per thread
_THREAD_SCALES = (0.75, 1.5)  # each thread's factor on the differentiable inputs (exact)
_FREE_TRIES = 5


def _program(case: Case):
    """A jitted program with two call sites of the op (equal keyword arguments)."""

    def two_sites(*args):
        first = case.call(*args)
        second = case.call(*args)
        return [a + 0 * b for a, b in zip(first, second)]

    return jax.jit(two_sites)


def _rows(case: Case) -> Iterator[CheckResult]:
    watch: Watch = case.watch
    sdef = case.binding.options.state
    seen = case.binding.role("f").kind is not Body.KERNEL  # a kernel's uses are not seen
    program = _program(case)
    _free()  # the earlier families' programs: this one sets the state up anew
    setups, uses = len(watch.setups), len(watch.uses)
    outputs = [program(*case.args) for _ in range(_RUNS)]
    jax.block_until_ready(outputs)
    made = len(watch.setups) - setups
    objects = {obj for obj, *_ in watch.uses[uses:]}
    limit = sdef.pool_size if sdef.concurrency == "pool" else 1
    detail = f"{made} setup(s) for 2 sites x {_RUNS} runs"
    bad = made > limit
    if made == 0:  # its state outlived jax.clear_caches(): a program the check did not make
        detail += " (a program made before the check holds its state)"
    if seen:
        detail += f", {len(objects)} object(s) used"
        bad = bad or not 1 <= len(objects) <= limit
    yield case.row("state: set up once per site", "f", "-", 1.0 if bad else 0.0, 0.0, detail)

    assert case.direct is not None
    for name, av, fresh, reused in zip(case.out_names, case.out_avals, case.direct, outputs[-1]):
        yield case.row(
            "state: fresh vs reused object",
            name,
            av.dtype,
            rel(reused, fresh, True),
            case.tol("exact", av.dtype),
        )

    yield from _threads(case, program, watch, seen)

    del program, outputs
    for _ in range(_FREE_TRIES):  # (a thread that ran a program may let go a moment later)
        _free()
        left, held = watch.left()
        if not left and not held:
            break
        time.sleep(0.05)
    yield _teardowns(case, watch, left, held)
    if sdef.teardown is not None:
        errors = watch.teardown_errors
        detail = errors[0] if errors else ""
        if len(errors) > 1:
            detail += f" (and {len(errors) - 1} more failure(s))"
        yield case.row("state: teardown runs", "teardown", "-", len(errors), 0.0, detail)


def _teardowns(case: Case, watch: Watch, left: int, held: int) -> CheckResult:
    """The row of teardowns: objects set up during the check that no site holds and no
    teardown freed fail it; a state that a program outside JAX's caches still holds
    makes it "not checked" (that program's teardown cannot be seen)."""
    name = "state: teardowns equal setups"
    made = len(watch.setups)
    detail = f"{made} set up, {made - left - held} of them torn down during the check"
    if watch.earlier:
        detail += f" (and {watch.earlier} set up before it, by programs it freed)"
    if left:
        detail += f"; {left} still alive after jax.clear_caches(), held by no call site"
        return case.row(name, "f", "-", left / max(made, 1), 0.0, detail)
    holders = watch.holders()
    if held or (holders and not made):
        sites = ", ".join(f"{label}: {n} call site(s)" for label, n in holders)
        why = (
            f"{detail}; the op's state is still held by {sites or 'a call site'} of a "
            "program that outlived jax.clear_caches() (compiled or exported outside JAX's "
            "caches, and kept): free that program before the check to check its teardowns"
        )
        return not_checked(name, "f", why)
    return case.row(name, "f", "-", 0.0, 0.0, detail)


def _free() -> None:
    """Free every program in JAX's caches (and the op's eager ones), with their states."""
    jax.clear_caches()
    gc.collect()


def _thread_inputs(case: Case, k: int) -> tuple:
    """Thread k's inputs: each differentiable argument scaled by the thread's factor (the
    fixed and integer ones as given), so that two calls at once differ in their inputs."""
    scale = _THREAD_SCALES[k]
    diff = set(case.differentiable)
    return tuple(
        np.asarray(a * scale, a.dtype) if i in diff else a for i, a in enumerate(case.args)
    )


def _threads(case: Case, program, watch: Watch, seen: bool) -> Iterator[CheckResult]:
    sdef = case.binding.options.state
    inputs = [_thread_inputs(case, k) for k in (0, 1)]
    alone = [program(*inputs[k]) for k in (0, 1)]  # each thread's reference, one at a time
    jax.block_until_ready(alone)
    uses = len(watch.uses)
    results: list = [None, None]
    failures: list = []
    start = threading.Barrier(2)

    def run(k):
        try:
            start.wait()
            results[k] = [program(*inputs[k]) for _ in range(_THREAD_RUNS)]
            jax.block_until_ready(results[k])
        except Exception as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    target = f"2 threads, {sdef.concurrency!r}"
    if failures:
        yield case.row("state: two threads", target, "-", np.inf, 0.0, f"raised {failures[0]!r}")
        return
    detail = (
        f"each thread on its inputs (differentiable ones x{_THREAD_SCALES[0]}, "
        f"x{_THREAD_SCALES[1]}) against them run alone"
        if case.differentiable
        else "both threads on the example inputs (none is differentiable, none is scaled)"
    )
    for o, (name, av) in enumerate(zip(case.out_names, case.out_avals)):
        error = max(rel(run[o], alone[k][o], True) for k in (0, 1) for run in results[k])
        tol = case.tol("exact", av.dtype)
        yield case.row("state: two threads", f"{target}, {name}", av.dtype, error, tol, detail)
    if not seen:
        return
    recent = Watch(sdef)
    recent.uses = watch.uses[uses:]
    most = recent.most_at_once()
    allowed = None if sdef.concurrency == "shared" else 1
    detail = f"at most {most} call(s) at once on one object"
    yield case.row(
        "state: two threads, one user per object",
        target,
        "-",
        0.0 if allowed is None or most <= allowed else 1.0,
        0.0,
        detail + ("" if allowed is None else " (allowed: 1)"),
    )


def _applies(case: Case) -> bool | str:
    if case.binding.options.state is None:
        return False
    return needs_f(case)


FAMILY = Family(
    name="state",
    checks=(
        "state: set up once per site",
        "state: fresh vs reused object",
        "state: two threads",
        "state: two threads, one user per object",
        "state: teardowns equal setups",
        "state: teardown runs",
    ),
    roles=frozenset({"f"}),
    options=frozenset({"state", "state_key"}),
    applies=_applies,
    rows=_rows,
)
