"""state: an op with ``state=`` (see docs/state.md), through a program of its own.

- **set up once per site**: JAX's caches cleared, a jitted program with two call sites
  of the op, run three times, sets its state up once and uses one object ("lock",
  "shared"), or at most ``pool_size`` ("pool"). Where a program made before the check
  (compiled or exported outside JAX's caches, and kept) still holds the state, the
  program sets nothing up: the row is "not checked" and names the op and role of the
  sites that hold it;
- **fresh vs reused object**: that program's outputs, its object used five times
  already, against the function called directly with an object of its own;
- **two threads**: the program run from two threads at once, each on inputs of its own
  (the example inputs, each differentiable one scaled by a factor per thread, and for a
  state with ``key=``, thread 1's other key inputs reversed: two key values' states in
  use at once), agrees with that thread's inputs run alone first; and no object is used
  by two calls at once unless the state is ``"shared"``. A key input with no second
  value (or one the op refuses alone) makes agreeing rows "not checked";
- **teardowns equal setups**: every object set up during the check is torn down once
  ``jax.clear_caches()`` has freed the programs that use it. Where a program outside
  JAX's caches still holds the state, the row is "not checked" and names the op and
  role of the sites that hold it (the run time tells the check of every site's lease,
  a compiled kernel's too);
- **teardown runs**, for a state with ``teardown=``: no teardown raised, in the check's
  programs or after its direct calls (a teardown's failure is its own row: the calls
  before it did not fail).

It runs last: it clears JAX's caches, twice (jitted functions compile again afterwards).
A compiled kernel uses its state in C++, where the check cannot see which object a call
used: its rows compare outputs, count setups and name the sites that lease the state.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator

import jax
import numpy as np

from .case import Case, Family, inexact, needs_f, rel, short
from .report import CheckResult, not_checked
from .watch import Watch

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
    seen = not case.binding.role("f").kind.compiled  # a kernel's uses are not seen
    program = _program(case)
    _free()  # the earlier families' programs: this one sets the state up anew
    setups, uses = len(watch.setups), len(watch.uses)
    outputs = [program(*case.args) for _ in range(_RUNS)]
    jax.block_until_ready(outputs)
    made = len(watch.setups) - setups
    objects = {obj for obj, *_ in watch.uses[uses:]}
    limit = sdef.pool_size if sdef.concurrency == "pool" else 1
    detail = f"{made} setup(s) for 2 sites x {_RUNS} runs"
    if seen:
        detail += f", {len(objects)} object(s) used"
    earlier = watch.holders(earlier=True)
    if made == 0 or earlier:  # its state outlived jax.clear_caches(): not this program's
        yield not_checked("state: set up once per site", "f", _held_from_before(detail, earlier))
    else:
        bad = made > limit or (seen and not 1 <= len(objects) <= limit)
        yield case.row("state: set up once per site", "f", "-", float(bad), 0.0, detail)

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
    earlier = watch.holders(earlier=True)
    if held or not made or earlier:
        holders = ", ".join(f"{label}: {n} call site(s)" for label, n in watch.holders())
        why = (
            f"{detail}; the op's state is still held by {holders or 'a call site'} of a "
            "program that outlived jax.clear_caches() (compiled or exported outside JAX's "
            "caches, and kept): free that program before the check to check its teardowns"
        )
        if not made and not holders:
            why = _held_from_before(detail, [])
        return not_checked(name, "f", why)
    return case.row(name, "f", "-", 0.0, 0.0, detail)


def _held_from_before(detail: str, earlier: list) -> str:
    """Why a row cannot count this check's setups: the op's state was set up before the
    check, and a program kept from then still holds it (`earlier`: the states seen with
    an object from then, each as the label of the site that set it up and a count)."""
    if earlier:
        by = ", ".join(sorted({label for label, _ in earlier}))
        held = f"its state was set up before the check, by {by}, and"
    else:  # (no site of the check leased, set up or used a state: out of Python's sight)
        held = (
            "no object was set up during the check, and it saw no call site take the state "
            "(a compiled kernel uses its state where Python cannot see it):"
        )
    return (
        f"{detail}: {held} a program kept from before the check (compiled or exported "
        "outside JAX's caches) still holds it: free that program before the check to count "
        "its setups"
    )


def _free() -> None:
    """Free every program in JAX's caches (and the op's eager ones), with their states."""
    jax.clear_caches()
    gc.collect()


def _thread_inputs(case: Case, k: int, keys: dict) -> tuple:
    """Thread k's inputs: each differentiable argument scaled by the thread's factor (the
    fixed and integer ones as given), so that two calls at once differ in their inputs;
    the key inputs among those replaced by `keys` (see _other_keys)."""
    scale = _THREAD_SCALES[k]
    diff = set(case.differentiable)
    args = [np.asarray(a * scale, a.dtype) if i in diff else a for i, a in enumerate(case.args)]
    for i, value in keys.items():
        args[i] = value
    return tuple(args)


def _finite(outputs) -> bool:
    return all(np.all(np.isfinite(o)) for o in outputs)


def _other_keys(case: Case) -> tuple[dict, str, str]:
    """Thread 1's own values of the state's key inputs that the factors leave as given
    (fixed or integer arguments), so that the threads use states of two key values at
    once: each one's elements in reverse order (its values, so within the op's domain),
    or a float key of one value times 0.75. Returns them by position, how they were
    varied, and why thread 1 shares thread 0's key value ("" if it does not)."""
    sdef = case.binding.options.state
    diff = set(case.differentiable)
    keys, how = {}, []
    for name, i in zip(sdef.key, case.binding.options.state_key):
        if i in diff or i >= len(case.args):
            continue
        a = np.asarray(case.args[i])
        other, change = np.flip(a.reshape(-1)).reshape(a.shape), "reversed"
        if np.array_equal(other, a) and inexact(a):
            other, change = np.asarray(a * 0.75, a.dtype), "x0.75"
        if np.array_equal(other, a):
            why = f"the state's key input {name!r} (argument {i}) has no second value to give"
            return {}, "", why + " a thread (it reads the same reversed)"
        keys[i] = other
        how.append(f"key input {name!r} {change} for thread 1")
    return keys, ", ".join(how), ""


def _threads(case: Case, program, watch: Watch, seen: bool) -> Iterator[CheckResult]:
    """Two threads at once, in one or two phases (each thread's inputs per phase): both on
    the example key values, then, for a state with key inputs the factors leave as given,
    thread 1 on key values of its own (one key value's object shared by two calls, then
    two key values' states in use at once)."""
    sdef = case.binding.options.state
    target = f"2 threads, {sdef.concurrency!r}"
    keys, how, unvaried = _other_keys(case)
    phases = [[_thread_inputs(case, k, {}) for k in (0, 1)]]
    alone = [[program(*i) for i in phases[0]]]  # each thread's reference, one at a time
    jax.block_until_ready(alone)
    if keys:
        own = [phases[0][0], _thread_inputs(case, 1, keys)]
        try:
            out = program(*own[1])
            jax.block_until_ready(out)
            bad = not _finite(out) and _finite(alone[0][1])
            failed = "gave values that are not finite" if bad else ""
        except Exception as exc:
            failed = f"raised {short(exc)}"
        if failed:  # a key value the op does not take
            unvaried = f"thread 1's inputs ({how}) {failed} when run alone: the key cannot vary"
        else:
            phases.append(own)
            alone.append([alone[0][0], out])
    uses = len(watch.uses)
    results: list = [[None, None] for _ in phases]
    failures: list = []
    start = threading.Barrier(2)

    def run(k):
        try:
            for p, inputs in enumerate(phases):
                start.wait()
                results[p][k] = [program(*inputs[k]) for _ in range(_THREAD_RUNS)]
                jax.block_until_ready(results[p][k])
        except Exception as exc:
            start.abort()
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failures = [e for e in failures if not isinstance(e, threading.BrokenBarrierError)]
    if failures:
        yield case.row("state: two threads", target, "-", np.inf, 0.0, f"raised {failures[0]!r}")
        return
    detail = (
        f"each thread on its inputs (differentiable ones x{_THREAD_SCALES[0]}, "
        f"x{_THREAD_SCALES[1]}) against them run alone"
        if case.differentiable
        else "both threads on the example inputs (none is differentiable, none is scaled)"
    )
    if len(phases) > 1:
        detail += f"; then again with the {how}"
    for o, (name, av) in enumerate(zip(case.out_names, case.out_avals)):
        error = max(
            rel(run[o], alone[p][k][o], True)
            for p in range(len(phases))
            for k in (0, 1)
            for run in results[p][k]
        )
        tol = case.tol("exact", av.dtype)
        if unvaried and error <= tol:  # (a disagreement still fails)
            why = f"{detail}: they agree, but {unvaried}, and two key values' states were "
            yield not_checked("state: two threads", f"{target}, {name}", why + "not used at once")
        else:
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
