"""Bundles run without Python: demos/run_bundle.c, a PJRT host in C, runs programs that
jaxbind.bundle wrote (C kernels, a C state, jnp operations, gradients, vmap) on a CPU PJRT
plugin with jaxbind's C runtime, and gives JAX's outputs; bad bundles fail naming the op.
The host's tests skip without a plugin (see tests/support/pjrt_host.py)."""

import ctypes
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.pjrt_host import build_host, build_library

import jaxbind

HERE = pathlib.Path(__file__).parent


@pytest.fixture(scope="module")
def clib(tmp_path_factory):
    return ctypes.CDLL(str(build_library(tmp_path_factory, HERE / "kernels.c")))


@pytest.fixture(scope="module")
def ops(clib):
    scale = jaxbind.linear_op(shape=lambda x, **kw: x, name="runtime_c.scale")(
        jaxbind.kernel(clib.scale)
    )
    scale.def_transpose(scale.fn)
    weights = jaxbind.c_state(clib.weights_setup, clib.weights_teardown, params=("n",))
    weighted = jaxbind.linear_op(shape=lambda x, **kw: x, state=weights, name="runtime_c.weighted")(
        jaxbind.kernel(clib.weighted)
    )
    weighted.def_transpose(weighted.fn)
    return scale, weighted


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return build_host(tmp_path_factory)


def program(ops):
    scale, weighted = ops

    def f(x, xs):
        y = jnp.sin(scale(x, factor=2.0)) + 3 * weighted(x, n=8)  # C kernels and jnp
        z = weighted(jnp.cos(x), n=8)  # a second site with equal setup arguments
        batch = jax.vmap(lambda r: scale(r, factor=0.5))(xs)  # jaxbind's batch loop
        return y * z, batch.sum(axis=0) + weighted(x[:4], n=4)

    return f


def assert_close_to_jax(got, want):
    """Bitwise, or within 4 units in the last place (a plugin of another XLA)."""
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        ulps = np.abs(g.view(np.int32).astype(np.int64) - w.view(np.int32).astype(np.int64))
        assert ulps.max() <= 4, (g, w)


def setups(stderr: str, n: int | None = None) -> int:
    return sum(
        line.startswith("weights_setup") and (n is None or f"n={n}" in line)
        for line in stderr.splitlines()
    )


def test_c_kernels_state_and_jnp_give_jax_outputs_without_python(host, ops, tmp_path):
    f = program(ops)
    x = np.linspace(-1.0, 2.0, 8).astype(np.float32)
    xs = np.arange(12, dtype=np.float32).reshape(3, 4)
    bundle = jaxbind.bundle(f, x, xs, path=tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert {c["binding"] for c in manifest["calls"]} == {"runtime_c.scale", "runtime_c.weighted"}
    assert all(c["kernel"]["library"].startswith("lib/") for c in manifest["calls"])
    done, outs = host.run(bundle, x, xs, repeat=4)
    assert done.returncode == 0, done.stderr
    assert_close_to_jax(outs, jax.jit(f)(x, xs))
    assert "libpython mapped: no" in done.stdout
    # five runs: each setup argument set once (n=8: two sites share it; n=4), and torn
    # down by jaxbind_release
    assert (setups(done.stderr, 8), setups(done.stderr, 4)) == (1, 1)
    assert done.stderr.count("weights_teardown") == 2
    assert "states torn down: 2" in done.stdout


def test_gradient_program_gives_jax_gradient(host, ops, tmp_path):
    f = program(ops)
    loss = lambda x, xs: sum(jnp.sum(o**2) for o in f(x, xs))
    grad = jax.grad(loss, argnums=(0, 1))
    x = np.linspace(-1.0, 2.0, 8).astype(np.float32)
    xs = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    bundle = jaxbind.bundle(grad, x, xs, path=tmp_path / "g")
    roles = {
        (c["binding"], c["role"])
        for c in json.loads((tmp_path / "g" / "manifest.json").read_text())["calls"]
    }
    assert ("runtime_c.weighted", "T") in roles and ("runtime_c.scale", "T") in roles
    done, outs = host.run(bundle, x, xs)
    assert done.returncode == 0, done.stderr
    assert_close_to_jax(outs, jax.jit(grad)(x, xs))
    assert (setups(done.stderr, 8), setups(done.stderr, 4)) == (1, 1)  # f and T share them


def test_one_op_called_at_two_shapes_runs_each_call_on_its_buffers(host, ops, tmp_path):
    """Both calls have one site (the digest does not cover shapes): the site accepts both
    of the manifest's buffers."""
    scale, _ = ops
    f = lambda x: (scale(x, factor=2.0), scale(x[:4], factor=2.0))
    x = np.linspace(-1.0, 2.0, 8).astype(np.float32)
    bundle = jaxbind.bundle(f, x, path=tmp_path / "two")
    manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    sites = [c["site"] for c in manifest["calls"]]
    assert len(sites) == 2 and len(set(sites)) == 1
    done, outs = host.run(bundle, x)
    assert done.returncode == 0, done.stderr
    assert_close_to_jax(outs, jax.jit(f)(x))


def test_portable_bundle_has_no_calls_and_gives_jax_outputs(host, tmp_path):
    @jaxbind.linear_op(
        shape=lambda x: x, reference=lambda x: 2 * x, name="runtime_c.doubled_callable"
    )
    def doubled(x):
        return 2 * np.asarray(x)

    f = lambda x: jnp.tanh(doubled(x))
    x = np.linspace(-1.0, 1.0, 8).astype(np.float32)
    for portable in (True, False):  # a Python callable: its reference either way
        bundle = jaxbind.bundle(f, x, path=tmp_path / f"p{portable}", portable=portable)
        assert json.loads((tmp_path / f"p{portable}" / "manifest.json").read_text())["calls"] == []
        done, outs = host.run(bundle, x)
        assert done.returncode == 0, done.stderr
        assert_close_to_jax(outs, [jax.jit(f)(x)])


# Refused at bundle time: what a host without Python cannot run, naming the op and the fix


def test_python_callable_without_reference_is_refused_naming_the_op(tmp_path):
    op = jaxbind.linear_op(shape=lambda x: x, name="runtime_c.callable_only")(lambda x: 2 * x)
    with pytest.raises(
        TypeError,
        match=r"'runtime_c.callable_only' \(the function\) cannot go "
        r"into a bundle.*Python callable.*reference.*compiled body",
    ):
        jaxbind.bundle(lambda x: op(x), np.ones(3, np.float32), path=tmp_path / "r")


def test_numba_kernel_is_refused_naming_the_op_and_the_fix(tmp_path):
    pytest.importorskip("numba")

    @jaxbind.linear_op(shape=lambda x: x, name="runtime_c.numba_kernel")
    @jaxbind.kernel
    def twice(out, x):
        for i in range(x.size):
            out.flat[i] = 2 * x.flat[i]

    with pytest.raises(
        TypeError,
        match=r"'runtime_c.numba_kernel'.*numba kernel.*reference.*C "
        r"kernel",
    ):
        jaxbind.bundle(lambda x: twice(x), np.ones(3, np.float32), path=tmp_path / "n")


def test_python_state_is_refused_naming_the_op(clib, tmp_path):
    @jaxbind.state
    def weights(*, n):
        return np.linspace(1.0, 2.0, n)

    op = jaxbind.linear_op(shape=lambda x, **kw: x, state=weights, name="runtime_c.py_state")(
        jaxbind.kernel(clib.weighted)
    )
    with pytest.raises(TypeError, match=r"'runtime_c.py_state'.*state '[\w.<>]*weights'.*c_state"):
        jaxbind.bundle(lambda x: op(x, n=3), np.ones(3, np.float32), path=tmp_path / "s")


def test_c_state_runs_in_python_as_a_state(ops, clib):
    _, weighted = ops
    x = np.linspace(0.0, 1.0, 8).astype(np.float32)
    made, freed = clib.weights_made, clib.weights_freed
    made.restype = freed.restype = ctypes.c_int64
    jax.clear_caches()
    before = (made(), freed())
    y = jax.jit(lambda x: weighted(x, n=8) + weighted(2 * x, n=8))(x)
    np.testing.assert_allclose(y, 3 * (1 + np.arange(8) / 8) * x, rtol=1e-6)
    assert made() - before[0] == 1
    jax.clear_caches()
    assert made() - before[0] == freed() - before[1]
    jaxbind.testing.check(weighted, x, n=8, verbose=False)


def test_setup_struct_is_the_headers():
    """jaxbind_setup in jaxbind/kernel.h is the table's (jaxbind/_kernels/abi.py)."""
    import re

    from jaxbind._kernels import abi

    header = (pathlib.Path(jaxbind.kernel_include_dir()) / "jaxbind" / "kernel.h").read_text()
    header = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    body = re.search(r"typedef struct jaxbind_setup \{(.*?)\}", header, re.S).group(1)
    assert tuple(re.findall(r"(\w+)\s*;", body)) == abi.SETUP.fields


# Bad bundles: an error naming the op, never a crash


@pytest.fixture
def good_bundle(ops, tmp_path):
    scale, weighted = ops
    f = lambda x: weighted(scale(x, factor=2.0), n=8)
    x = np.linspace(0.0, 1.0, 8).astype(np.float32)
    return jaxbind.bundle(f, x, path=tmp_path / "good"), x


def edit_manifest(bundle, edit):
    path = pathlib.Path(bundle) / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def call_of(manifest, binding):
    return next(c for c in manifest["calls"] if c["binding"] == binding)


def test_missing_library_fails_naming_the_op(host, good_bundle):
    bundle, x = good_bundle
    shutil.rmtree(pathlib.Path(bundle) / "lib")
    done, _ = host.run(bundle, x)
    assert done.returncode == 1
    assert "'runtime_c." in done.stderr and "cannot load its library" in done.stderr


def test_missing_symbol_fails_naming_the_op(host, good_bundle):
    bundle, x = good_bundle
    edit_manifest(bundle, lambda m: call_of(m, "runtime_c.scale")["kernel"].update(symbol="gone"))
    done, _ = host.run(bundle, x)
    assert done.returncode == 1
    assert "'runtime_c.scale' (the function)" in done.stderr and "no symbol 'gone'" in done.stderr


def test_wrong_abi_version_fails_naming_the_op(host, good_bundle):
    bundle, x = good_bundle
    edit_manifest(bundle, lambda m: call_of(m, "runtime_c.scale")["kernel"].update(abi_version=99))
    done, _ = host.run(bundle, x)
    assert done.returncode == 1
    assert "'runtime_c.scale' (the function)" in done.stderr and "ABI version 99" in done.stderr


def test_manifest_without_a_call_of_the_program_fails_naming_the_op(host, good_bundle):
    bundle, x = good_bundle
    edit_manifest(bundle, lambda m: m["calls"].remove(call_of(m, "runtime_c.weighted")))
    done, _ = host.run(bundle, x)
    assert done.returncode == 1
    assert "'runtime_c.weighted'" in done.stderr and "no registered bundle lists" in done.stderr


def test_manifest_with_other_buffers_fails_naming_the_op(host, good_bundle):
    bundle, x = good_bundle
    edit_manifest(
        bundle,
        lambda m: call_of(m, "runtime_c.scale")["buffers"]["inputs"][0].update(shape=[4]),
    )
    done, _ = host.run(bundle, x)
    assert done.returncode == 1
    assert "'runtime_c.scale' (the function)" in done.stderr
    assert "float32[8]" in done.stderr and "float32[4]" in done.stderr


def test_manifest_naming_another_op_fails_naming_both(host, good_bundle):
    bundle, x = good_bundle
    edit_manifest(bundle, lambda m: call_of(m, "runtime_c.scale").update(binding="runtime_c.other"))
    done, _ = host.run(bundle, x)
    assert done.returncode == 1
    assert "'runtime_c.scale'" in done.stderr and "does not match the program" in done.stderr


def test_failing_setup_and_kernel_fail_naming_the_op(host, good_bundle):
    bundle, x = good_bundle
    edit_manifest(
        bundle, lambda m: call_of(m, "runtime_c.weighted")["state"]["arguments"][0].update(int=0)
    )
    done, _ = host.run(bundle, x)
    assert done.returncode == 1
    assert "'runtime_c.weighted' (the function)" in done.stderr
    assert "weights_setup needs n >= 1, got 0" in done.stderr
    edit_manifest(
        bundle, lambda m: call_of(m, "runtime_c.scale")["kernel"].update(symbol="failing")
    )
    done, _ = host.run(bundle, x)
    assert done.returncode == 1
    assert "kernel of 'runtime_c.scale' (the function) failed: failing was called" in done.stderr
