"""Every option a program bakes in travels with it: redefined, each option gives the old
program either the right result or the error that names the op, what differs and "trace
it again", in a jitted program and in an exported one loaded where the op differs.

The table below has one row per option of both APIs (`OPTION_NAMES`, plus the fixed
count and vectorized batching under each API's name); an option added to jaxbind without a
row here, or a field of `Options` that jaxbind._definition does not classify, fails
`test_every_option_has_a_row`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.processes import run_cases

import jaxbind
from jaxbind import _definition
from jaxbind._options import OPTION_NAMES, Options

AGAIN = "trace the program again"
X = jnp.array([2.0, 3.0, 4.0, 5.0], jnp.float32)
A = jnp.array(3.0, jnp.float32)


@jaxbind.state
def _plan(*, scale=1.0):
    return {"scale": scale}


def _scale_sum(x, **kw):  # a rule function: one pass-through factor
    return "n -> n"


@dataclasses.dataclass(frozen=True)
class Row:
    """One option, its value in the program (`then`) and in the op later (`now`); the
    op is a * x for the options that need a fixed argument, else 2 x (+ 1 in place)."""

    option: str
    then: object
    now: object
    fixed: bool = False  # the op takes a leading fixed argument a
    inplace: bool = False  # the body adds 1 to its output (an input it aliases)
    exportable: bool = True  # jax.export takes programs with the `then` value


ROWS = [
    Row("fixed", 1, 0, fixed=True),
    Row("vectorized", False, True),
    Row("platform_mode", "device", "host"),
    Row("input_output_aliases", None, {0: 0}, inplace=True),
    Row("has_side_effect", False, True),
    Row("ordered", False, True),
    Row("linear_in", (), (1,), fixed=True),
    Row("state", None, _plan),
    Row("sharding", None, "n -> n"),
    Row("reduction", (), ("m",)),
    Row("prefer_reference", (), ("cpu",)),
    # the other way round, where the program's value can be exported
    Row("input_output_aliases", {0: 0}, None, inplace=True),
    Row("state", _plan, None),
    Row("sharding", _scale_sum, None),
]
NAMES = {True: {}, False: {"fixed": "first_n_args_fixed", "vectorized": "func_can_batch"}}


def _options(row: Row, value, native: bool) -> dict:
    name = NAMES[native].get(row.option, row.option)
    options = {name: value}
    if row.option == "reduction":
        options["sharding"] = "n m -> n"
    if row.fixed and row.option != "fixed":
        options[NAMES[native].get("fixed", "fixed")] = 1
    return options


def _make(row: Row, value, native: bool, name: str, replace: bool):
    """The row's op, defined with the option at `value`."""
    options = _options(row, value, native)
    if row.option == "reduction":  # x (n, m) -> the sum over m
        shape: Callable = lambda *a, **kw: jax.ShapeDtypeStruct(a[-1].shape[:1], a[-1].dtype)
    else:
        shape = lambda *a, **kw: jax.ShapeDtypeStruct(a[-1].shape, a[-1].dtype)
    takes_state = row.option == "state" and value is not None
    if row.option == "prefer_reference":  # (the reference computes what the body does)
        options["reference"] = lambda *a, **kw: 2 * a[-1]

    def compute(*args, **kw):
        x = np.asarray(args[-1])
        y = (args[0] * x if len(args) > 1 else 2 * x) if not row.inplace else x + 1
        if row.option == "reduction":
            y = np.sum(y, axis=1)
        return y

    if native:
        if takes_state:

            def body(*args, state, **kw):
                return compute(*args, **kw)
        else:

            def body(*args, **kw):
                kw.pop("batch_axes", None)
                return compute(*args, **kw)

        return jaxbind.nonlinear_op(shape=shape, name=name, replace=replace, **options)(body)

    def f(out, args, kd):
        if row.inplace:
            out[0][...] += 1
            return
        out[0][...] = compute(*args)

    def abstract(*args, **kw):
        s = shape(*args)
        return ((s.shape, s.dtype),)

    return jaxbind.get_nonlinear_call(
        f, (None, None), abstract, None, name=name, replace=replace, **options
    )


X2 = jnp.arange(12.0, dtype=jnp.float32).reshape(4, 3)


def _call(op, native: bool, row: Row):
    def fn(a, x):
        x = X2 + x[0] if row.option == "reduction" else x
        args = (a, x) if row.fixed else (x,)
        y = op(*args)
        return y if native else y[0]

    return fn


CASES = [(row, native) for row in ROWS for native in (True, False)]


def _id(case):
    row, native = case
    api = "native" if native else "jaxbind13"
    return f"{row.option}-{row.then!r:.12}-to-{row.now!r:.12}-{api}".replace(" ", "")


def test_every_option_has_a_row():
    """An option of either API, or a field of Options, that the table or
    jaxbind._definition leaves out fails here: give it a row, and a place in the record
    (COMPARED or PER_CALL) or a reason it is read at run time (READ_AT_RUN_TIME) or chosen
    at lowering (CHOSEN_AT_LOWERING)."""
    assert {r.option for r in ROWS} == {*OPTION_NAMES, "fixed", "vectorized"}
    fields = {f.name for f in dataclasses.fields(Options)}
    classified = [
        *_definition.COMPARED,
        *_definition.PER_CALL,
        *_definition.READ_AT_RUN_TIME,
        *_definition.CHOSEN_AT_LOWERING,
    ]
    assert len(classified) == len(set(classified)), "an option classified twice"
    assert set(classified) == fields


def _outcome(fn, args):
    """('ok', result) or ('error', message)."""
    try:
        return "ok", np.asarray(jax.block_until_ready(fn(*args)))
    except Exception as exc:  # the run-time error
        return "error", str(exc)


def _right_or_refused(outcome, expected, name: str, row: Row):
    kind, value = outcome
    if kind == "ok":
        np.testing.assert_allclose(value, expected, rtol=1e-6)
    else:
        assert f"'{name}'" in value and AGAIN in value, value


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_redefined_op_gives_a_compiled_program_its_result_or_the_error(case):
    row, native = case
    name = f"tests.travels.jit.{_id(case)}"
    op = _make(row, row.then, native, name, replace=False)
    program = jax.jit(_call(op, native, row))
    before = _outcome(program, (A, X))
    assert before[0] == "ok", before[1]
    op = _make(row, row.now, native, name, replace=True)
    expected = np.asarray(jax.jit(_call(op, native, row))(A, X))
    _right_or_refused(_outcome(program, (A, X)), expected, name, row)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_redefined_op_gives_a_loaded_artifact_its_result_or_the_error(case):
    row, native = case
    name = f"tests.travels.export.{_id(case)}"
    op = _make(row, row.then, native, name, replace=False)
    fn = _call(op, native, row)
    if row.option in ("has_side_effect", "ordered") and row.then:
        with pytest.raises(TypeError, match="side effects"):
            jaxbind.export(fn)(A, X)
        return
    blob = jaxbind.export(fn)(A, X).serialize()
    op = _make(row, row.now, native, name, replace=True)
    expected = np.asarray(jax.jit(_call(op, native, row))(A, X))
    loaded = jax.export.deserialize(blob)
    _right_or_refused(_outcome(loaded.call, (A, X)), expected, name, row)


def test_inplace_op_given_aliases_later_refuses_the_old_program():
    """The issue's case: an in-place body (out += 1) whose op gains input_output_aliases;
    the program traced before gave uninitialized memory plus 1, with no error."""
    row = Row("input_output_aliases", None, {0: 0}, inplace=True)
    name = "tests.travels.inplace"
    op = _make(row, None, False, name, replace=False)
    program = jax.jit(lambda x: op(x)[0])
    program(X)
    op = _make(row, {0: 0}, False, name, replace=True)
    with pytest.raises(
        Exception, match=r"input_output_aliases=None.*input_output_aliases=\{0: 0\}"
    ):
        jax.block_until_ready(program(X))


@pytest.fixture(scope="module")
def four_devices():
    return run_cases("runtime/definition_cases.py")


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [
        "case_jitted_program_split_by_a_rule_refuses_the_rule_changed",
        "case_loaded_four_device_artifact_refuses_another_rule_or_none",
        "case_rule_function_giving_another_rule_refuses_the_program",
    ],
)
def test_program_partitioned_by_a_rule_runs_only_under_that_rule(four_devices, case):
    """A cumulative sum split by "n -> n", run (or loaded) where the op's rule is "n -> k"
    or absent, gave per-device sums; now it names the op and the rules."""
    entry = four_devices.get(case)
    assert entry is not None, f"{case} did not run"
    assert entry["ok"], entry["detail"]
