"""CUDA kernels (jaxbind.cuda_kernel) on a GPU: launched by jaxbind's C++ on XLA's stream,
under jit, vmap, grad and export, and captured into XLA's command buffers.

The kernels are compiled with nvcc (PTX and cubin); skipped where nvcc is missing, and
without a GPU (see conftest.py).
"""

import os
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbind

SOURCE = r"""
extern "C" __global__ void scale(float* y, const float* x, float a, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void sum_diff(double* s, double* d, const double* x, const double* y,
                                    long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) { s[i] = x[i] + y[i]; d[i] = x[i] - y[i]; }
}
"""


def _compiled(tmp_path_factory, kind):
    nvcc = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
    )
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    where = tmp_path_factory.mktemp("cuda")
    src = where / "k.cu"
    src.write_text(SOURCE)
    out = where / f"k.{kind}"
    subprocess.run(
        [
            nvcc,
            f"-{kind}",
            "-arch=sm_90" if kind == "cubin" else "-arch=compute_90",
            str(src),
            "-o",
            str(out),
        ],
        check=True,
    )
    return out.read_bytes()


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    return _compiled(tmp_path_factory, "ptx").decode()


@pytest.fixture(scope="module")
def cubin(tmp_path_factory):
    return _compiled(tmp_path_factory, "cubin")


def _gpu(x):
    return jax.device_put(x, jax.devices("cuda")[0])


def _scale_op(code, name):
    kernel = jaxbind.cuda_kernel(
        code, "scale", scalars=lambda y, x, *, a: (np.float32(a), np.int64(x.size))
    )
    shape = lambda x, **kw: ((x.shape, x.dtype),)
    return jaxbind.get_linear_call(kernel, kernel, shape, shape, name=name)


def test_a_ptx_kernel_under_jit_vmap_grad_and_transpose(ptx):
    op = _scale_op(ptx, "cudak.scale_ptx")
    x = _gpu(jnp.linspace(-1, 1, 1000, dtype=jnp.float32))
    y = jax.jit(lambda x: op(x, a=3.0)[0] + 1)(x)
    np.testing.assert_allclose(np.asarray(y), 3 * np.asarray(x) + 1, rtol=1e-6)
    xs = _gpu(jnp.arange(24, dtype=jnp.float32).reshape(4, 6))
    ys = jax.jit(jax.vmap(lambda v: op(v, a=2.0)[0]))(xs)  # one launch per row
    np.testing.assert_allclose(np.asarray(ys), 2 * np.arange(24).reshape(4, 6))
    g = jax.jit(jax.grad(lambda x: jnp.sum(op(x, a=5.0)[0] ** 2)))(x)
    np.testing.assert_allclose(np.asarray(g), 50 * np.asarray(x), rtol=1e-5)
    text = jax.jit(lambda x: op(x, a=3.0)[0]).lower(x).as_text()
    assert "jaxbind_cuda_kernel" in text


def test_a_cubin_kernel_with_two_outputs_in_the_native_api(cubin, enable_x64):
    """Outputs' pointers come first, then the inputs', then the scalars."""
    kernel = jaxbind.cuda_kernel(cubin, "sum_diff", scalars=lambda s, d, x, y: (x.size,))
    op = jaxbind.nonlinear_op(
        shape=lambda x, y: (jax.ShapeDtypeStruct(x.shape, x.dtype),) * 2, name="cudak.sum_diff"
    )(kernel)
    x = _gpu(jnp.arange(300, dtype=jnp.float64))
    y = _gpu(jnp.full(300, 0.5, dtype=jnp.float64))
    s, d = jax.jit(op)(x, y)
    np.testing.assert_array_equal(np.asarray(s), np.arange(300) + 0.5)
    np.testing.assert_array_equal(np.asarray(d), np.arange(300) - 0.5)


def test_a_kernel_program_exports_and_runs_in_a_fresh_process(ptx, tmp_path):
    op = _scale_op(ptx, "cudak.scale_export")
    x = _gpu(jnp.arange(8, dtype=jnp.float32))
    exported = jaxbind.export(jax.jit(lambda x: op(x, a=4.0)[0]))(x)
    blob = tmp_path / "prog.bin"
    blob.write_bytes(exported.serialize())
    (tmp_path / "ptx.txt").write_text(ptx)
    script = textwrap.dedent(f"""
        import jax, jax.numpy as jnp, numpy as np, jaxbind, pathlib
        ptx = pathlib.Path({str(tmp_path / "ptx.txt")!r}).read_text()
        kernel = jaxbind.cuda_kernel(ptx, "scale",
            scalars=lambda y, x, *, a: (np.float32(a), np.int64(x.size)))
        shape = lambda x, **kw: ((x.shape, x.dtype),)
        op = jaxbind.get_linear_call(kernel, kernel, shape, shape, name="cudak.scale_export")
        exp = jax.export.deserialize(pathlib.Path({str(blob)!r}).read_bytes())
        x = jax.device_put(jnp.arange(8, dtype=jnp.float32), jax.devices("cuda")[0])
        print(np.asarray(exp.call(x)).tolist())
    """)
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # this process has the GPU
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == str([4.0 * i for i in range(8)])


def test_a_kernel_that_is_not_in_the_module_is_a_clear_error(ptx):
    kernel = jaxbind.cuda_kernel(ptx, "no_such_kernel")
    shape = lambda x, **kw: ((x.shape, x.dtype),)
    op = jaxbind.get_nonlinear_call(kernel, (None, None), shape, None, name="cudak.missing")
    with pytest.raises(Exception, match=r"cudak.missing.*no_such_kernel"):
        jax.block_until_ready(jax.jit(lambda x: op(x)[0])(_gpu(jnp.ones(4, jnp.float32))))


_GRAPH_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np, jaxbind, pathlib, sys
from jaxbind import _ext
ptx = pathlib.Path(sys.argv[1]).read_text()
kernel = jaxbind.cuda_kernel(ptx, "scale",
    scalars=lambda y, x, *, a: (np.float32(a), np.int64(x.size)))
shape = lambda x, **kw: ((x.shape, x.dtype),)
op = jaxbind.get_linear_call(kernel, kernel, shape, shape, name="cudak.scale_graph")

def chain(x):
    for i in range(100):
        x = op(x, a=1.0 + 1e-3)[0] + 1e-3
    return x

x = jax.device_put(jnp.ones(256, jnp.float32), jax.devices("cuda")[0])
f = jax.jit(chain)
y = jax.block_until_ready(f(x))
before = _ext.cuda_kernel_launches()
for _ in range(20):
    y = f(x)
jax.block_until_ready(y)
print(float(np.asarray(y)[0]), _ext.cuda_kernel_launches() - before)
"""


@pytest.mark.parametrize("on", [True, False], ids=["command buffers on", "off"])
def test_a_chain_of_kernel_calls_in_xla_command_buffers(ptx, tmp_path, on):
    """With command buffers that take custom calls (the handler declares itself
    compatible), XLA captures the program's 100 launches into a CUDA graph and replays it:
    runs call no handler, but for the few where XLA records again (a run's buffers moved:
    2 in 5 runs on an H200). Without, each run launches 100 times."""
    (tmp_path / "ptx.txt").write_text(ptx)
    kinds = "FUSION,CUSTOM_CALL" if on else ""
    flags = f"--xla_gpu_enable_command_buffer={kinds} --xla_gpu_graph_min_graph_size=1"
    out = subprocess.run(
        [sys.executable, "-c", _GRAPH_SCRIPT, str(tmp_path / "ptx.txt")],
        capture_output=True,
        text=True,
        env={**os.environ, "XLA_FLAGS": flags, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    value, launches = out.stdout.split()[-2:]
    want = np.float32(1.0)
    for _ in range(100):
        want = np.float32(want * np.float32(1.001)) + np.float32(1e-3)
    assert float(value) == pytest.approx(float(want), rel=1e-5)
    assert int(launches) < 500 if on else int(launches) == 2000
