"""abstract vs callable: the function, called directly on outputs pre-filled with sentinels,
writes every element the abstract function declares, and raises nothing.

An output that shares an input's memory (``input_output_aliases``) starts with the input's
values instead, as in a program; an element it keeps is a valid in-place update, so its
row is "not checked".
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np

from .._roles import for_call
from .._state import outside_programs
from .._where import lowering_platform, runs
from .case import Case, Family, short
from .report import CheckResult, not_checked


def sentinels(dtype):
    """Two values that a callable is unlikely to write."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(True), np.array(False)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array(info.max, dtype), np.array(info.min, dtype)
    return np.array(1.2345e4, dtype), np.array(-9.875e3, dtype)  # exact in every float type


def aliased(case: Case) -> dict[int, int]:
    """output -> the input whose memory it shares."""
    return {o: i for i, o in case.binding.options.aliases}


def outputs_for(case: Case, inputs, fill) -> tuple:
    """f's outputs as a call hands them over: aliased ones hold their input's values, the
    others `fill(aval)`."""
    shared = aliased(case)
    return tuple(
        np.array(inputs[shared[k]], dtype=av.dtype) if k in shared else fill(av)
        for k, av in enumerate(case.out_avals)
    )


def _runs_here(case: Case) -> bool | str:
    """True, or why f's body cannot be called directly, on host arrays, on this machine's
    platform (a CUDA kernel, on the CPU or on a GPU): the families that need its direct call
    say so, and do not fail."""
    platform = lowering_platform(jax.default_backend())
    where = runs(case.binding, "f", platform)
    platforms = " and ".join(where.kind.platforms)
    if not where.body_runs_here:
        case.failed = f"its body runs in {platforms} programs only, not on {platform}"
    elif "cpu" not in where.kind.platforms:  # (check calls f on host arrays)
        case.failed = f"its body takes {platforms} device buffers only, not host arrays"
    else:
        return True
    return f"the function: {case.failed}"


def _rows(case: Case) -> Iterator[CheckResult]:
    inputs = []
    for a in case.args:
        a = np.array(a)  # a private, read-only copy, like the trampoline's views
        a.setflags(write=False)
        inputs.append(a)
    runs = []
    for k in (0, 1):
        outs = outputs_for(
            case, inputs, lambda av: np.full(av.shape, sentinels(av.dtype)[k], dtype=av.dtype)
        )
        try:
            with outside_programs(
                case.binding,
                case.dump.to_dict(),
                inputs,
                f"'{case.binding.name}'",
                teardown_failed=case.teardown_failed,
            ):
                for_call(case.binding.f, case.trees)(outs, tuple(inputs), case.dump)
        except Exception as exc:
            case.failed = short(exc)
            yield case.row("callable runs", "f", "-", np.inf, 0.0, case.failed)
            return
        runs.append(outs)
    case.direct = runs[1]
    shared = aliased(case)
    for k, (name, av, o0, o1) in enumerate(zip(case.out_names, case.out_avals, *runs)):
        if k in shared:
            yield not_checked(
                "abstract vs callable: written",
                name,
                f"{name} shares the memory of input {shared[k]} (input_output_aliases): "
                "an element it keeps is an in-place update",
            )
            continue
        s0, s1 = sentinels(av.dtype)
        left = (o0 == s0) & (o1 == s1)
        frac = float(left.mean()) if left.size else 0.0
        detail = f"{frac:.0%} of the elements left unwritten" if frac else ""
        yield case.row("abstract vs callable: written", name, av.dtype, frac, 0.0, detail)


FAMILY = Family(
    name="abstract vs callable",
    checks=("callable runs", "abstract vs callable: written"),
    roles=frozenset({"f"}),
    options=frozenset({"aliases", "pytree_api"}),
    applies=_runs_here,
    rows=_rows,
)
