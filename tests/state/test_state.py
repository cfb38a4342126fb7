"""State (``state=``, ``@jaxbind.state``): set up once per call site group when XLA
instantiates it, shared by every role, freed with the executables, set up again by
name in another process (export, persistent cache), under each concurrency policy,
keyed on traced fixed arguments; and the errors."""

import gc
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import ops
from support.dtypes import global_x64
from support.processes import run_isolated

import jaxbind
from jaxbind._runtime.state import live_states


class Counts:
    """Setups and teardowns of a test's state."""

    def __init__(self):
        self.setups: list = []
        self.teardowns = 0

    def teardown(self, obj):
        self.teardowns += 1


def scaled_op(name, counts, **state_options):
    """A linear op x -> scale * x whose scale comes from its state (set up from the op's
    keyword argument `scale`)."""

    @jaxbind.state(teardown=counts.teardown, **state_options)
    def plan(*, scale):
        counts.setups.append(scale)
        return {"scale": float(scale)}

    @jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name=name, replace=True)
    def op(x, *, state, scale):
        return x * state["scale"]

    @op.def_transpose
    def _(ct, *, state, scale):
        return ct * state["scale"]

    return op


def _freed():
    jax.clear_caches()
    gc.collect()


def test_setup_runs_once_per_group_of_sites_with_equal_arguments():
    counts = Counts()
    op = scaled_op("state.once", counts)
    x = jnp.arange(3.0)
    f = jax.jit(lambda x: op(x, scale=2.0) + op(3 * x, scale=2.0) + op(x, scale=3.0))
    for _ in range(3):
        np.testing.assert_allclose(f(x), 2 * x + 6 * x + 3 * x)
    assert sorted(counts.setups) == [2.0, 3.0]
    g = jax.jit(lambda x: op(x, scale=2.0) * 2)  # another executable, same arguments: shared
    g(x)
    assert sorted(counts.setups) == [2.0, 3.0]
    del f, g
    _freed()
    assert counts.teardowns == len(counts.setups)


def test_every_role_shares_one_object():
    counts = Counts()
    op = scaled_op("state.roles", counts)
    x = jnp.arange(3.0)
    value, grad = jax.jit(jax.value_and_grad(lambda x: op(x, scale=4.0).sum()))(x)
    np.testing.assert_allclose(grad, [4.0, 4.0, 4.0])
    assert counts.setups == [4.0]  # f and T: one setup
    del value, grad
    _freed()
    assert counts.teardowns == 1


def test_teardowns_equal_setups_and_nothing_stays_alive_over_many_cycles():
    counts = Counts()
    op = scaled_op("state.cycles", counts)
    x = jnp.arange(4.0)
    _freed()
    before = live_states()
    for i in range(200):
        jax.jit(lambda x: op(x, scale=1.0 + i % 3))(x).block_until_ready()
        if i % 20 == 19:
            _freed()
    _freed()
    assert len(counts.setups) >= 10
    assert counts.teardowns == len(counts.setups)
    assert live_states() == before


def test_load_state_gives_the_object_to_jaxbind_13_callables():
    made = []

    @jaxbind.state
    def table(*, n):
        made.append(n)
        return np.arange(n, dtype=np.float64)

    def f(out, args, kwargs_dump):
        out[0][...] = args[0] + jaxbind.load_state(kwargs_dump)

    def shape(x, **kwargs):
        return ((x.shape, x.dtype),)

    op = jaxbind.get_nonlinear_call(
        f, (None, None), shape, state=table, name="state.jaxbind13", replace=True
    )
    x = jnp.ones(5)
    np.testing.assert_allclose(jax.jit(lambda x: op(x, n=5)[0])(x), 1 + np.arange(5))
    assert made == [5]
    with pytest.raises(LookupError, match="no state here"):
        jaxbind.load_state()


def test_key_sets_up_again_only_when_the_inputs_change():
    made = []

    @jaxbind.state(key=("points",))
    def plan(*, points, shift):
        made.append(points.copy())
        return points.sum() + shift

    @jaxbind.linear_op(shape=lambda p, x, **kw: x, fixed=1, state=plan, name="state.key")
    def op(points, x, *, state, shift):
        return x * state

    f = jax.jit(lambda p, x: op(p, x, shift=1.0))
    p, x = jnp.arange(3.0), jnp.ones(2)
    for _ in range(3):
        np.testing.assert_allclose(f(p, x), 4.0 * x)  # traced, loop-invariant points
    assert len(made) == 1
    np.testing.assert_allclose(f(p + 1, x), 7.0 * x)
    assert len(made) == 2
    np.testing.assert_allclose(f(p, x), 4.0 * x)  # kept (a small LRU)
    assert len(made) == 2


def test_nufft_plan_in_state_matches_planning_per_call():
    ducc0 = pytest.importorskip("ducc0")
    rng = np.random.default_rng(0)
    coord = rng.uniform(-np.pi, np.pi, (50, 2))
    shape = (16, 16)

    @jaxbind.state
    def nufft_plan(*, coord, grid_shape, epsilon):
        return ducc0.nufft.plan(
            nu2u=False, coord=coord, grid_shape=grid_shape, epsilon=epsilon, nthreads=1
        )

    def out_shape(f, **kw):
        return jax.ShapeDtypeStruct((kw["coord"].shape[0],), jnp.complex128)

    @jaxbind.linear_op(shape=out_shape, state=nufft_plan, name="state.type2")
    def type2(f, *, state, **kw):
        return state.u2nu(grid=f, forward=True)

    @type2.def_transpose
    def _(c, *, state, **kw):
        return state.nu2u(points=c, forward=True, out=np.empty(kw["grid_shape"], c.dtype))

    with global_x64(True):
        f = jnp.asarray(rng.normal(size=shape) + 1j * rng.normal(size=shape))
        kw = dict(coord=coord, grid_shape=shape, epsilon=1e-9)
        got = jax.jit(lambda f: type2(f, **kw))(f)
        ref = ducc0.nufft.u2nu(grid=np.asarray(f), coord=coord, forward=True, epsilon=1e-9)
        np.testing.assert_allclose(got, ref, rtol=1e-7, atol=1e-7)
        jaxbind.testing.check(type2, f, **kw)


def test_errors_name_the_op_and_the_fix():
    @jaxbind.state
    def plan(*, scale):
        return scale

    with pytest.raises(TypeError, match="takes no 'state' argument"):

        @jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name="state.bad1")
        def op1(x, *, scale):
            return x

    with pytest.raises(TypeError, match="declared with @jaxbind.state"):
        jaxbind.linear_op(shape=lambda x: x, state=lambda: 1)
    with pytest.raises(ValueError, match="concurrency must be one of"):
        jaxbind.state(concurrency="free")(lambda *, a: a)
    with pytest.raises(TypeError, match="'a' is positional"):
        jaxbind.state(lambda a: a)
    with pytest.raises(TypeError, match="key names 'y', which the setup does not take"):
        jaxbind.state(key=("y",))(lambda *, a: a)
    keyed = jaxbind.state(key=("x",))(lambda *, x: x)
    with pytest.raises(ValueError, match="'x' is not one of the op's arguments"):

        @jaxbind.linear_op(shape=lambda y, **kw: y, state=keyed, name="state.bad2")
        def op2(y, *, state):
            return y


def test_the_concurrency_policies_are_the_trampolines_own():
    """jaxbind.state accepts exactly the policies the trampoline's state cells define
    (cpp/state_cell.h), and a cell refuses any other, naming those it knows."""
    policies = jaxbind._ext.state_policies
    assert set(policies) == {"lock", "pool", "shared"}
    for policy in policies:
        sdef = jaxbind.state(concurrency=policy)(lambda *, a: a)
        jaxbind._ext.StateCell(sdef.concurrency, sdef.pool_size, sdef, "'tests' (f)")
    with pytest.raises(ValueError, match=r"concurrency must be one of \('lock', 'pool'"):
        jaxbind.state(concurrency="free")(lambda *, a: a)
    with pytest.raises(ValueError, match="unknown concurrency policy 'free' .one of 'lock'"):
        jaxbind._ext.StateCell("free", 1, sdef, "'tests' (f)")


def test_a_failing_setup_fails_compilation_naming_the_op_and_role():
    op = ops.failing_setup("state.failing")

    with pytest.raises(
        Exception, match=r"'state.failing' \(the function\).*setup of its state.*no plan today"
    ):
        jax.jit(lambda x: op(x, scale=1.0))(jnp.ones(2)).block_until_ready()

    @jaxbind.state
    def needs(*, scale, other):
        return 1

    @jaxbind.linear_op(shape=lambda x, **kw: x, state=needs, name="state.missing")
    def op2(x, *, state, scale):
        return x

    with pytest.raises(Exception, match="needs the keyword argument 'other'"):
        jax.jit(lambda x: op2(x, scale=1.0))(jnp.ones(2)).block_until_ready()


def _raises_zero_division(*, scale, **keys):
    return scale / 0  # (the line a setup's error must show)


def _fails_to_free(obj):
    raise ValueError("cannot free")  # (the line a teardown's warning must show)


def _user_line(fn) -> str:
    """How a traceback shows the line of `fn`'s body."""
    return f'File "{__file__}", line {fn.__code__.co_firstlineno + 1}, in {fn.__name__}'


@pytest.mark.parametrize("when", ["instantiate", "call (key=)"])
def test_a_failing_setup_reports_the_op_the_state_and_the_users_file_and_line(when):
    keyed = when != "instantiate"
    plan = jaxbind.state(key=("p",) if keyed else ())(_raises_zero_division)

    @jaxbind.linear_op(
        shape=lambda p, x, **kw: x, fixed=1, state=plan, name="state.setup_line", replace=True
    )
    def op(p, x, *, state, scale):
        return x

    with pytest.raises(Exception) as caught:
        jax.jit(lambda p, x: op(p, x, scale=1.0))(jnp.ones(2), jnp.ones(2)).block_until_ready()
    text = str(caught.value)
    assert "'state.setup_line'" in text and "'_raises_zero_division' failed" in text, text
    assert "ZeroDivisionError" in text and _user_line(_raises_zero_division) in text, text


def test_a_failing_teardown_warns_with_the_users_file_and_line():
    plan = jaxbind.state(teardown=_fails_to_free)(lambda *, scale: scale)

    @jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name="state.teardown_line")
    def op(x, *, state, scale):
        return x

    program = jax.jit(lambda x: op(x, scale=1.0))
    program(jnp.ones(2)).block_until_ready()
    with pytest.warns(RuntimeWarning, match="teardown of its state") as warned:
        del program  # (the state goes with the last program that uses it)
        _freed()
    text = "\n".join(str(w.message) for w in warned)
    assert "'state.teardown_line'" in text and _user_line(_fails_to_free) in text, text


MODULE = """
import os
import jax, jax.numpy as jnp, jaxbind

COUNT = os.environ["STATE_COUNT_FILE"]

@jaxbind.state
def plan(*, scale):
    with open(COUNT, "a") as f:
        f.write("setup\\n")
    return scale

@jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name="state_module.op")
def op(x, *, state, scale):
    return x * state

@op.def_transpose
def _(ct, *, state, scale):
    return ct * state
"""


def _setups(path) -> int:
    return path.read_text().count("setup") if path.exists() else 0


@pytest.mark.slow
def test_an_exported_program_sets_up_again_in_a_fresh_process(tmp_path):
    (tmp_path / "state_module.py").write_text(MODULE)
    count = tmp_path / "count.txt"
    code = """
    import os, sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ["STATE_COUNT_FILE"] = sys.argv[2]
    import jax, jax.numpy as jnp, numpy as np, jaxbind
    from state_module import op
    x = jnp.arange(3.0)
    if sys.argv[1] == "export":
        exp = jaxbind.export(jax.jit(jax.grad(lambda x: op(x, scale=3.0).sum())))(x)
        open(os.path.join(os.path.dirname(sys.argv[2]), "grad.bin"), "wb").write(exp.serialize())
    else:
        from jax import export
        data = open(os.path.join(os.path.dirname(sys.argv[2]), "grad.bin"), "rb").read()
        exp = export.deserialize(bytearray(data))
        for _ in range(3):
            np.testing.assert_allclose(exp.call(x), [3.0, 3.0, 3.0])
    print("ok")
    """
    done = run_isolated(tmp_path, textwrap.dedent(code), "export", count)
    assert done.returncode == 0, done.stderr
    assert _setups(count) == 0  # exporting compiles nothing
    done = run_isolated(tmp_path, textwrap.dedent(code), "load", count)
    assert done.returncode == 0, done.stderr
    assert _setups(count) == 1  # f and T of the grad: one object, set up by name


@pytest.mark.slow
def test_a_persistent_cache_hit_sets_up_again_in_a_fresh_process(tmp_path):
    (tmp_path / "state_module.py").write_text(MODULE)
    count = tmp_path / "count.txt"
    code = """
    import os, sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ["STATE_COUNT_FILE"] = sys.argv[1]
    import jax, jax.numpy as jnp, numpy as np, jaxbind
    jax.config.update("jax_compilation_cache_dir", sys.argv[2])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from state_module import op
    f = jax.jit(lambda x: op(x, scale=2.0) + 1)
    np.testing.assert_allclose(f(jnp.arange(3.0)), [1.0, 3.0, 5.0])
    print(len(os.listdir(sys.argv[2])))
    """
    cache = tmp_path / "cache"
    cache.mkdir()
    first = run_isolated(tmp_path, textwrap.dedent(code), count, cache)
    assert first.returncode == 0, first.stderr
    entries = int(first.stdout.split()[-1])
    assert entries >= 1
    second = run_isolated(tmp_path, textwrap.dedent(code), count, cache)
    assert second.returncode == 0, second.stderr
    assert int(second.stdout.split()[-1]) == entries  # a hit: nothing new cached
    assert _setups(count) == 2  # once per process


CONCURRENT = """
import os, sys, threading, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np, jaxbind
from jax.sharding import Mesh, PartitionSpec as P

policy = sys.argv[1]
lock = threading.Lock()
active, most, made = [0], [0], []

options = dict(concurrency=policy)
if policy == "pool":
    options["pool_size"] = 2

@jaxbind.state(**options)
def plan(*, scale):
    made.append(1)
    return scale

@jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name="state.concurrent")
def op(x, *, state, scale):
    with lock:
        active[0] += 1
        most[0] = max(most[0], active[0])
    time.sleep(0.05)  # without the GIL: other devices' calls may start
    with lock:
        active[0] -= 1
    return x * state

mesh = Mesh(np.array(jax.devices()), ("d",))
shard_map = getattr(jax, "shard_map", None)
if shard_map is None:
    from jax.experimental.shard_map import shard_map
f = jax.jit(shard_map(lambda x: op(x, scale=2.0), mesh=mesh, in_specs=P("d"), out_specs=P("d")))
x = jnp.arange(16.0)
for _ in range(3):
    np.testing.assert_allclose(f(x), 2 * np.arange(16.0))
np.testing.assert_allclose(jax.jit(lambda x: op(x, scale=2.0))(x), 2 * np.arange(16.0))
print(most[0], len(made))
"""


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["lock", "pool", "shared"])
def test_concurrency_policies_under_shard_map_on_four_devices(tmp_path, policy):
    done = run_isolated(tmp_path, CONCURRENT, policy)
    assert done.returncode == 0, done.stderr
    most, made = map(int, done.stdout.split()[-2:])
    if policy == "lock":
        assert (most, made) == (1, 1)  # one user at a time, one object
    elif policy == "pool":
        assert most <= 2 and made <= 2
    else:
        assert made == 1 and most >= 2  # one object, used by several devices at once


def test_a_setup_that_returns_none_is_set_up_once_and_torn_down():
    """None is an object like any other (a plan for an empty problem)."""
    counts = Counts()

    @jaxbind.state(teardown=counts.teardown)
    def nothing(*, scale):
        counts.setups.append(scale)
        return None

    @jaxbind.linear_op(shape=lambda x, **kw: x, state=nothing, name="state.none", replace=True)
    def op(x, *, state, scale):
        assert state is None
        return x * scale

    @op.def_transpose
    def _(ct, *, state, scale):
        return ct * scale

    x = jnp.arange(3.0)
    f = jax.jit(lambda x: op(x, scale=2.0) + op(x, scale=2.0))
    g = jax.jit(jax.grad(lambda x: op(x, scale=2.0).sum()))
    for _ in range(3):
        f(x), g(x)
    assert counts.setups == [2.0]
    del f, g
    _freed()
    assert counts.teardowns == 1
