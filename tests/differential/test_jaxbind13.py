"""jaxbind is a drop-in for JAXbind 1.3.1: the calls of calls.py, and calls that hypothesis
draws from the same spaces of values, run under both, compared row by row.

JAXbind 1.3.1 runs in a venv of its own (harness.reference_python: JAXBIND13_PYTHON, which
.ci/run sets, or benchmarks/.venv-jaxbind13); without one these tests skip, saying how to
make it. Each side runs in a worker process (worker.py); the table runs in batches, both
workers at once.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from . import calls, harness
from .calls import DIFFERS13, SAME, WRONG13, Row

# Differences that another change of issue 46 removes, by jaxbind's message: a drawn row
# that fails so is an expected failure until then (table rows say so: Row.pending).
PENDING: dict[str, str] = {}  # error pattern -> the change that removes it (none now)

BATCH = 150  # rows per round trip: a crash or a hang costs at most one batch's restart


@pytest.fixture(scope="module")
def workers():
    python, source = harness.reference_python()
    if python is None:
        pytest.skip(source)
    ref = harness.Worker(python, "jaxbind13")
    ours = harness.Worker(harness.ours_python(), "jaxbind")
    try:
        mismatch = {
            k: (ref.versions[k], ours.versions[k])
            for k in ("jax", "jaxlib", "numpy", "ducc0")
            if ref.versions[k] != ours.versions[k]
        }
        problem = None
        if ref.versions["jaxbind"] != "1.3.1":
            problem = f"{source} has jaxbind {ref.versions['jaxbind']}, not 1.3.1"
        elif mismatch:
            problem = f"{source} differs from this Python (1.3.1's, ours): {mismatch}"
        if problem:
            if source == "JAXBIND13_PYTHON":  # CI named it: a setup error, not a skip
                pytest.fail(problem)
            pytest.skip(f"{problem}; run bash benchmarks/compare_jaxbind13.sh to remake it")
        yield ref, ours
    finally:
        ref.close()
        ours.close()


def check(row: Row, ref: dict, ours: dict) -> str | None:
    """What is wrong with jaxbind's outcome of `row`, given 1.3.1's; None if nothing."""
    if row.expect == WRONG13:
        if not harness.accepted(ref):
            return f"stale row: 1.3.1 refused it too ({harness.describe(ref)})"
        if harness.accepted(ours):
            return f"jaxbind accepted it ({row.why})"
        if not re.search(row.match, ours["message"], re.S):
            return f"jaxbind's message does not say why: {harness.describe(ours)}"
        return None
    if row.expect == DIFFERS13:
        if not (harness.accepted(ref) and harness.accepted(ours)):
            return f"stale row: 1.3.1 {harness.describe(ref)}, jaxbind {harness.describe(ours)}"
        same_seen = set(ref["seen"]) == set(ours["seen"])
        if harness.value_difference(ref["value"], ours["value"], row.rtol) is None and same_seen:
            return "stale row: the results and the keyword arguments seen agree"
        return None
    assert row.expect == SAME
    if not harness.accepted(ref):
        return None  # 1.3.1 refused: jaxbind may refuse it or accept it
    if not harness.accepted(ours):
        return f"1.3.1 accepted it, jaxbind refused it: {harness.describe(ours)}"
    diff = harness.value_difference(ref["value"], ours["value"], row.rtol)
    if diff:
        return f"results differ: {diff}"
    seen_ref, seen_ours = set(ref["seen"]), set(ours["seen"])
    if seen_ref != seen_ours:
        return (
            "the callables saw other keyword arguments: 1.3.1 "
            f"{sorted(seen_ref - seen_ours)}, jaxbind {sorted(seen_ours - seen_ref)}"
        )
    return None


def _pending(ours) -> str | None:
    if harness.accepted(ours):
        return None
    for pattern, reason in PENDING.items():
        if re.search(pattern, ours["message"]):
            return reason
    return None


def run_rows(workers, rows) -> list[str]:
    """Run `rows` under both; the problems, one line per row, and xfail for pending rows."""
    ref, ours = workers
    problems, pending = [], []
    for start in range(0, len(rows), BATCH):
        batch = rows[start : start + BATCH]
        got_ref, got_ours = harness.run_both(ref, ours, [r.wire for r in batch])
        for row in batch:
            problem = check(row, got_ref[row.id], got_ours[row.id])
            if problem is None:
                continue
            reason = _pending(got_ours[row.id])
            (pending if reason else problems).append(f"{row.id}: {reason or problem}")
    return problems + [f"PENDING {p}" for p in pending]


@pytest.fixture(scope="module")
def table_outcomes(workers):
    ref, ours = workers
    out = {}
    rows = calls.TABLE
    for start in range(0, len(rows), BATCH):
        batch = rows[start : start + BATCH]
        got_ref, got_ours = harness.run_both(ref, ours, [r.wire for r in batch])
        for row in batch:
            out[row.id] = (got_ref[row.id], got_ours[row.id])
    return out


@pytest.mark.parametrize("row", calls.TABLE, ids=[r.id for r in calls.TABLE])
def test_row(row, table_outcomes):
    ref, ours = table_outcomes[row.id]
    problem = check(row, ref, ours)
    if problem is None:
        return
    reason = row.pending or _pending(ours)
    if reason:
        pytest.xfail(reason)
    pytest.fail(f"{problem}\n1.3.1: {harness.describe(ref)}\njaxbind: {harness.describe(ours)}")


# --- spaces of values, drawn by hypothesis ---------------------------------------------------

# No shrinking: a failure names its rows already, and each example is a batch of compiled
# programs in two processes (seconds), which shrinking would run hundreds of times.
DRAWS = settings(
    max_examples=5,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _assert_none(problems):
    real = [p for p in problems if not p.startswith("PENDING ")]
    assert not real, "\n".join(problems)
    if problems:
        pytest.xfail("; ".join(sorted({p.split(": ", 1)[1] for p in problems}))[:500])


@st.composite
def wgridder_rows(draw):
    spellings = {
        "pixsize_x": calls.floats(2e-5),
        "pixsize_y": calls.floats(3e-5),
        "npix_x": calls.all_ints(32),
        "npix_y": calls.all_ints(32),
        "epsilon": calls.floats(1e-5) + [1e-3, 1e-7],
        "do_wgridding": calls.BOOLS,
    }
    optional = {
        "nthreads": calls.all_ints(1) + calls.all_ints(2),
        "flip_v": calls.BOOLS,
        "verbosity": calls.all_ints(0),
        "flip_u": calls.BOOLS,
        "flip_w": calls.BOOLS,
        "divide_by_n": calls.BOOLS,
        "allow_nshift": calls.BOOLS,
        "center_x": calls.floats(1e-4),
        "center_y": calls.floats(-2e-4),
        "sigma_min": calls.floats(1.3),
        "sigma_max": calls.floats(2.2),
        "double_precision_accumulation": calls.BOOLS,
    }
    factory = {k: draw(st.sampled_from(v)) for k, v in spellings.items()}
    for k in draw(st.lists(st.sampled_from(sorted(optional)), unique=True, max_size=5)):
        factory[k] = draw(st.sampled_from(optional[k]))
    transforms = draw(
        st.lists(st.sampled_from(calls.WGRIDDER_TRANSFORMS), min_size=1, max_size=2, unique=True)
    )
    single = draw(st.booleans())
    image = calls.IMAGE.astype(np.float32) if single else calls.IMAGE
    name = f"drawn {factory!r} {'float32' if single else 'float64'}"
    return calls.wgridder_row(name, transforms, image=image, **factory)


@st.composite
def fft_rows(draw):
    op = draw(st.sampled_from(["c2c", "genuine_fht"]))
    kwargs = {}
    # (not a negative axis beside others: 1.3.1 did not transform it, calls.py's DIFFERS13)
    axes = draw(st.sampled_from([None, 0, 1, -1, np.int64(1), (0,), (1, 0), [1], (-1,)]))
    if axes is not None or draw(st.booleans()):
        kwargs["axes"] = axes
    for name, values in (
        ("inorm", calls.all_ints(0) + calls.all_ints(1) + calls.all_ints(2)),
        ("nthreads", calls.all_ints(1) + calls.all_ints(2)),
        *((("forward", calls.BOOLS),) if op == "c2c" else ()),
    ):
        if draw(st.booleans()):
            kwargs[name] = draw(st.sampled_from(values))
    single = draw(st.booleans())
    x = calls.C if op == "c2c" else calls.R
    x = x.astype(np.complex64 if op == "c2c" else np.float32) if single else x
    transforms = draw(
        st.lists(st.sampled_from(calls.FFT_TRANSFORMS), min_size=1, max_size=2, unique=True)
    )
    return calls._fft(f"drawn {kwargs!r} {x.dtype}", op, kwargs, tuple(transforms), x=x)


@st.composite
def sht_rows(draw):
    lmax = draw(st.integers(0, 8))
    mmax = draw(st.integers(0, lmax))
    spin = draw(st.integers(0, min(lmax, 3)))
    nside = draw(st.sampled_from([1, 2, 4]))
    values = [draw(st.sampled_from(calls.all_ints(v))) for v in (nside, lmax, mmax, spin)]
    nthreads = draw(st.sampled_from(calls.all_ints(1) + calls.all_ints(2)))
    by_keyword = draw(st.booleans())
    names = ("nside", "lmax", "mmax", "spin", "nthreads")
    args = (*values, nthreads)
    transforms = tuple(
        draw(st.lists(st.sampled_from(calls.SHT_TRANSFORMS), min_size=1, max_size=2, unique=True))
    )
    if by_keyword:
        return calls.sht_row(
            f"drawn {dict(zip(names, args))!r}",
            kwargs=dict(zip(names, args)),
            transforms=transforms,
        )
    return calls.sht_row(f"drawn {args!r}", args, transforms=transforms)


HASHABLE = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        # (no subnormal floats: calls.SUBNORMAL, a table row)
        st.floats(allow_nan=False, allow_subnormal=False),
        st.text(max_size=5),
        st.binary(max_size=5),
        st.complex_numbers(
            allow_nan=False, allow_infinity=False, allow_subnormal=False, max_magnitude=1e6
        ),
        st.sampled_from(
            [
                np.int64(3),
                np.int32(-2),
                np.uint8(7),
                np.True_,
                np.False_,
                np.float32(0.5),
                np.float64(2.5),
                np.complex128(1j),
            ]
        ),
    ),
    lambda inner: st.lists(inner, max_size=3).map(tuple),
    max_leaves=6,
)


@st.composite
def core_rows(draw):
    api = draw(st.sampled_from(["linear", "nonlinear"]))
    nfixed = draw(st.integers(0, 2))
    options = {}
    if nfixed or draw(st.booleans()):
        options["first_n_args_fixed"] = draw(st.sampled_from(calls.all_ints(nfixed)))
    if draw(st.booleans()):
        options["func_can_batch"] = draw(st.sampled_from(calls.BOOLS))
    kwargs = draw(
        st.dictionaries(st.sampled_from(["a", "nthreads", "epsilon", "mode"]), HASHABLE, max_size=3)
    )
    transforms = calls.CORE_TRANSFORMS if api == "linear" else calls.NONLINEAR_TRANSFORMS
    picked = tuple(draw(st.lists(st.sampled_from(transforms), min_size=1, max_size=3, unique=True)))
    return calls._core(
        f"drawn {api} {options!r} {kwargs!r}", api, options, picked, nfixed=nfixed, kwargs=kwargs
    )


def _drawn(draw_rows):
    """A test that runs a batch of drawn rows (each draw: a few rows) under both."""

    @DRAWS
    @given(st.lists(draw_rows(), min_size=3, max_size=5))
    def test(workers, groups):
        rows = list({r.id: r for group in groups for r in group}.values())
        _assert_none(run_rows(workers, rows))

    return test


test_drawn_wgridder_parameters = _drawn(wgridder_rows)
test_drawn_fft_keyword_arguments = _drawn(fft_rows)
test_drawn_sht_parameters = _drawn(sht_rows)
test_drawn_core_options_and_keyword_arguments = _drawn(core_rows)
