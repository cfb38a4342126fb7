"""One site life: for every kind of op and every target a CPU program reaches, a call site
has one owner and one route that finds it (docs/sites.md).

- Owner: the programs compiled in this process that call the site ("program": their
  holder), or, for a program compiled elsewhere and loaded here, its executable
  ("executable"). The orphan LRU owns sites only where no slot keeps their Instance.
- Door: XLA's per-site slot ("slot"), where XLA instantiates the site; the execute-only
  door ("execute-only") where the host registered no instantiate stage or keeps no
  jaxbind object in a slot: jaxlib 0.7, whose FFI keeps no slot for jaxbind (a test
  below says so when it runs there), and the CUDA-kernel target, which is registered
  without an instantiate stage (_rules/targets.py; checked here from the table, since no
  GPU runs these tests).
"""

import gc
import pathlib
import re

import jax
import jax.numpy as jnp
import jaxlib.version
import numpy as np
import pytest
from support.ops import double, same_as_first
from support.processes import run_cases

import jaxbind
from jaxbind._rules.targets import TARGETS

# jaxlib 0.7's FFI (API 0.1) keeps no per-site slot for jaxbind (cpp/xla_slot.h)
SLOTS = tuple(int(p) for p in jaxlib.version.__version__.split(".")[:2]) >= (0, 8)
ROUTE = ["slot"] if SLOTS else ["execute-only"]
X = jnp.arange(4.0, dtype=jnp.float32)
ROOT = pathlib.Path(__file__).resolve().parents[2]
# What names the execute-only door (the Instance of a call found by its digest where no
# slot keeps one), by any of its names old or new: not the call's digest itself, nor the
# keyword arguments' digests.
DOOR = re.compile(
    r"execute[-_ ]?only|digest[-_ ]route|resolve_site|ByDigest"
    r"|(?:found|finds?|sites?|instances?) by (?:its |the |their )?digests?\b",
    re.IGNORECASE,
)


def _callable(name):
    return jaxbind.get_linear_call(double, double, same_as_first, same_as_first, name=name)


def _pytree_api(name):
    @jaxbind.linear_op(shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name=name)
    def twice(x):
        return 2 * x

    twice.def_transpose(twice.fn)
    return twice


def _kernel(name):
    numba = pytest.importorskip("numba")

    @numba.njit
    def twice(out, x):
        for i in range(x.shape[0]):
            out[i] = 2 * x[i]

    return jaxbind.get_linear_call(jaxbind.kernel(twice), None, same_as_first, None, name=name)


@jaxbind.state
def _plan(*, factor=2.0):
    return factor


def _stateful(name):
    @jaxbind.linear_op(shape=lambda x, **kw: x, state=_plan, name=name)
    def scaled(x, *, state, factor=2.0):
        return state * np.asarray(x)

    return scaled


def _effect(name):
    seen = []

    def record(out, args, kwargs_dump):
        seen.append(1)
        out[0][...] = 2 * args[0]

    return jaxbind.get_linear_call(
        record, None, same_as_first, None, name=name, has_side_effect=True
    )


KINDS = {
    "callable": _callable,
    "native": _pytree_api,
    "kernel": _kernel,
    "stateful": _stateful,
    "effect target": _effect,
}


def _first(result):
    return result[0] if isinstance(result, (list, tuple)) else result


def _live(op):
    """The op's live sites, each with its owners and its routes."""
    gc.collect()
    owned = op.binding.sites
    owners = owned.owners()
    sites = {id(s): s for s in owned.live().values()} | {id(s): s for s in owned.loaded}
    return [(owners.get(i, []), s.routes) for i, s in sites.items()]


@pytest.mark.parametrize("kind", KINDS)
def test_a_compiled_program_owns_its_site_and_finds_it_in_one_route(kind):
    op = KINDS[kind](f"tests.sites.compiled.{kind}")
    program = jax.jit(lambda x: _first(op(x)))
    for _ in range(3):
        np.testing.assert_allclose(program(X), 2 * X)
    live = _live(op)
    assert live == [(["program"], ROUTE)], live


@pytest.mark.parametrize("kind", ["callable", "native", "kernel", "stateful"])
def test_a_loaded_program_is_owned_by_its_executable(kind):
    op = KINDS[kind](f"tests.sites.loaded.{kind}")
    blob = jaxbind.export(lambda x: _first(op(x)))(X).serialize()
    loaded = jax.export.deserialize(blob)
    for _ in range(2):
        np.testing.assert_allclose(loaded.call(X), 2 * X)
    live = _live(op)
    expected = ["executable"] if SLOTS else ["orphans"]
    assert live == [(expected, ROUTE)], live


@pytest.mark.parametrize("kind", ["callable", "kernel", "stateful"])
def test_a_redefined_op_gives_the_program_a_new_site_in_the_same_route(kind):
    name = f"tests.sites.redefined.{kind}"
    op = KINDS[kind](name)
    program = jax.jit(lambda x: _first(op(x)))
    np.testing.assert_allclose(program(X), 2 * X)
    again = KINDS[kind](name)  # the same definition at the same place: it replaces it
    np.testing.assert_allclose(program(X), 2 * X)
    live = _live(again)
    assert all(owners == ["program"] and routes == ROUTE for owners, routes in live), live
    assert len(live) == 1, live


def test_the_sites_of_a_program_go_with_it():
    op = _callable("tests.sites.gone")
    program = jax.jit(lambda x: _first(op(x)))
    program(X)
    assert len(_live(op)) == 1
    del program
    jax.clear_caches()
    assert _live(op) == []


def test_only_the_cuda_kernel_targets_have_no_instantiate_stage():
    """The execute-only door's other user: targets registered with their execute stage alone
    (the CUDA-kernel targets, compatible with command buffers). Every other row of the
    table's custom call is instantiated by XLA (the reference row has none)."""
    execute_only = sorted(
        t.name for t in TARGETS if t.custom_call and "instantiate" not in t.stages
    )
    assert execute_only == ["jaxbind_cuda_kernel", "jaxbind_cuda_kernel_partitioned"]


@pytest.mark.skipif(SLOTS, reason="runs where XLA keeps no slot (jaxlib 0.7)")
def test_jaxlib_07_takes_the_execute_only_door():
    op = _callable("tests.sites.jaxlib07")
    program = jax.jit(lambda x: op(x)[0])  # (kept: its holder owns the site)
    program(X)
    assert [routes for _, routes in _live(op)] == [["execute-only"]]


@pytest.mark.slow
def test_a_partitioned_call_finds_its_site_in_the_slot_on_four_devices():
    results = run_cases("runtime/sites_cases.py")
    entry = results.get("case_partitioned_call_sites")
    assert entry is not None and entry["ok"], entry


@pytest.mark.skipif(not (ROOT / "cpp").is_dir(), reason="needs the source tree")
def test_three_files_at_most_know_the_execute_only_door():
    """The door lives in cpp/execute_only.h; cpp/site_life.h chooses it; _sites keeps the
    orphans it makes. No other source file of the trampoline or the package names it."""
    sources = sorted(
        [*(ROOT / "cpp").glob("*.h"), *(ROOT / "cpp").glob("*.cc")]
        + [*(ROOT / "src" / "jaxbind").rglob("*.py"), *(ROOT / "src" / "jaxbind").rglob("*.pyi")]
    )
    knowing = [str(p.relative_to(ROOT)) for p in sources if DOOR.search(p.read_text())]
    print("files that know the execute-only door:", ", ".join(knowing))
    assert len(knowing) <= 3, knowing
    assert "cpp/execute_only.h" in knowing  # (the pattern still finds the door)
