"""CUDA kernels (jaxbind.cuda_kernel) as far as a machine without a GPU can check them:
the options, the lowering to the command-buffer-compatible target, each signature's
launch, and the errors of a CPU program. Launches on a GPU: tests/gpu/test_gpu_kernels.py.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import SCALE_PTX as PTX  # loaded by no test

import jaxbind
from jaxbind._kernels.cuda import CudaKernelSite

shape = lambda x, **kw: ((x.shape, x.dtype),)


def _scale(name, **options):
    kernel = jaxbind.cuda_kernel(
        PTX, "scale", scalars=lambda y, x, *, a: (np.float32(a), np.int64(x.size)), **options
    )
    return kernel, jaxbind.get_linear_call(kernel, kernel, shape, shape, name=name)


def _cuda_text(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_calls_lower_to_the_cuda_kernel_target_in_both_apis_and_every_role():
    _, op = _scale("cudak_cpu.scale")
    x = jnp.ones((4, 3), jnp.float32)
    text = _cuda_text(lambda x: op(x, a=2.0)[0], x)
    assert "jaxbind_cuda_kernel" in text and 'role = "f"' in text
    assert 'role = "T"' in _cuda_text(jax.grad(lambda x: jnp.sum(op(x, a=2.0)[0])), x)
    assert 'num_batch_dims = "1"' in _cuda_text(jax.vmap(lambda v: op(v, a=2.0)[0]), x)
    native = jaxbind.linear_op(
        shape=lambda x, *, a: jax.ShapeDtypeStruct(x.shape, x.dtype), name="cudak_cpu.native"
    )(jaxbind.cuda_kernel(PTX, "scale", scalars=lambda y, x, *, a: (np.float32(a), x.size)))
    assert "jaxbind_cuda_kernel" in _cuda_text(lambda x: native(x, a=1.0), x)
    # on the CPU, without a reference: refused when lowered (below)
    safety = {str(c) for c in jaxbind.export_safety_checks()}
    assert any("jaxbind_cuda_kernel" in c for c in safety)


CPU_REFUSED = r"'{}'.*cannot be lowered for cpu: its body runs on cuda only.*reference="


@pytest.mark.parametrize("api", ["native", "jaxbind13"])
def test_a_cpu_program_that_calls_a_cuda_kernel_without_reference_is_refused_when_lowered(api):
    """No custom call that could only fail when run: the lowering names the op, the
    platform and the fix, in every role and under vmap, lowered or run eagerly."""
    name = f"cudak_cpu.on_cpu.{api}"
    if api == "native":
        kernel = jaxbind.cuda_kernel(
            PTX, "scale", scalars=lambda y, x, *, a: (np.float32(a), np.int64(x.size))
        )
        native = jaxbind.linear_op(
            shape=lambda x, *, a: jax.ShapeDtypeStruct(x.shape, x.dtype), name=name
        )(kernel)
        native.def_transpose(kernel)
        call = lambda x: native(x, a=2.0)
    else:
        _, op = _scale(name)
        call = lambda x: op(x, a=2.0)[0]
    x = jax.device_put(jnp.ones(3, jnp.float32), jax.devices("cpu")[0])
    refused = CPU_REFUSED.format(name)
    grad = jax.grad(lambda x: jnp.sum(call(x)))
    for fn, arg in ((call, x), (grad, x), (jax.vmap(call), jnp.ones((2, 3), jnp.float32))):
        with pytest.raises(NotImplementedError, match=refused):
            jax.jit(fn).trace(arg).lower(lowering_platforms=("cpu",))
    with pytest.raises(NotImplementedError, match=refused):
        jax.block_until_ready(jax.jit(call)(x))
    with pytest.raises(NotImplementedError, match=refused):
        call(x)  # eager
    with pytest.raises(NotImplementedError, match=refused):  # an artifact for both
        jaxbind.export(jax.jit(call), platforms=("cpu", "cuda"))(x)
    assert "jaxbind_cuda_kernel" in _cuda_text(call, x)  # CUDA lowering: unchanged


def _scale_reference(x, *, a):
    return [a * x]


def test_a_cuda_kernel_with_a_reference_runs_its_reference_in_cpu_programs():
    kernel = jaxbind.cuda_kernel(
        PTX, "scale", scalars=lambda y, x, *, a: (np.float32(a), np.int64(x.size))
    )
    op = jaxbind.get_linear_call(
        kernel, kernel, shape, shape, reference=_scale_reference, name="cudak_cpu.reference"
    )
    x = jnp.arange(3.0, dtype=jnp.float32)
    program = jax.jit(lambda x: op(x, a=2.0)[0])
    assert "stablehlo.custom_call" not in program.lower(x).as_text()  # the CPU: the reference
    np.testing.assert_allclose(program(x), 2 * x)
    assert "jaxbind_cuda_kernel" in _cuda_text(lambda x: op(x, a=2.0)[0], x)  # CUDA: the kernel
    with pytest.raises(NotImplementedError, match="runs on cuda only"):
        jax.jit(lambda x: _scale("cudak_cpu.noref")[1](x, a=1.0)[0]).trace(x).lower(
            lowering_platforms=("tpu",)
        )


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_check_of_a_cuda_kernel_op_reports_its_direct_calls_as_not_checked(backend, monkeypatch):
    """check calls f on host arrays, which a CUDA kernel never takes: on a CPU (its reference
    computes the programs) and on a GPU alike (the backend patched here), those rows say so
    instead of failing (found by the conformance matrix)."""
    kernel = jaxbind.cuda_kernel(
        PTX, "scale", scalars=lambda y, x, *, a: (np.float32(a), np.int64(x.size))
    )
    op = jaxbind.get_linear_call(
        kernel, kernel, shape, shape, reference=_scale_reference, name=f"cudak_{backend}.check"
    )
    from jaxbind.testing import written

    case = types.SimpleNamespace(binding=op.binding, failed=None)
    monkeypatch.setattr(written.jax, "default_backend", lambda: backend)
    why = written._runs_here(case)
    assert isinstance(why, str) and "cuda" in why, why
    if backend == "cpu":
        monkeypatch.undo()
        report = jaxbind.testing.check(op, np.arange(3.0, dtype=np.float32), a=2.0, verbose=False)
        assert any("cuda" in r.detail for r in report.not_checked()), str(report)


def _launch(kernel, ins, outs, **values):
    describe = lambda arrays: tuple(
        (0, a.shape, jaxbind._kernels.abi.xla_code(a.dtype)) for a in arrays
    )
    return CudaKernelSite(kernel, values, "where").launch(describe(ins), describe(outs))


def test_each_signature_gets_its_launch():
    kernel, _ = _scale("cudak_cpu.launch")
    x = np.ones(1000, np.float32)
    grid, block, shared, scalars = _launch(kernel, [x], [x], a=2.5)
    assert (grid, block, shared) == ((4, 1, 1), (256, 1, 1), 0)  # a thread per element
    assert scalars == (np.float32(2.5).tobytes(), np.int64(1000).tobytes())
    shaped = jaxbind.cuda_kernel(
        PTX,
        "scale",
        grid=lambda y, x, *, a: (x.shape[0], x.shape[1]),
        block=(32, 4),
        shared_memory=lambda y, x, *, a: 4 * x.shape[1],
        scalars=lambda y, x, *, a: (a, x.shape[0]),  # a Python float and int: double, int64
    )
    m = np.ones((6, 5), np.float32)
    grid, block, shared, scalars = _launch(shaped, [m], [m], a=0.5)
    assert (grid, block, shared) == ((6, 5, 1), (32, 4, 1), 20)
    assert scalars == (np.float64(0.5).tobytes(), np.int64(6).tobytes())


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(block=(32, 32, 2)), "more than 1024 threads"),
        (dict(grid=lambda y, x, **kw: 1 / 0), "its grid function failed"),
        (dict(scalars=lambda y, x, **kw: ("text",)), "a scalar parameter must be a NumPy scalar"),
        (dict(shared_memory=lambda y, x, **kw: -1), "shared_memory must give a non-negative"),
    ],
)
def test_a_bad_launch_is_an_error_that_says_what_and_the_fix(options, match):
    kernel = jaxbind.cuda_kernel(PTX, "scale", **options)
    x = np.ones(8, np.float32)
    with pytest.raises((TypeError, ValueError, ZeroDivisionError), match=match):
        _launch(kernel, [x], [x])


@pytest.mark.parametrize(
    "code, entry, options, match",
    [
        ("", "scale", {}, "code must be PTX text or a cubin/fatbin image"),
        ("int main() {}", "scale", {}, "neither a cubin or fatbin image nor PTX"),
        (PTX, "", {}, "entry must be the kernel function's name"),
        (PTX, "scale", dict(grid=(1, 2, 3, 4)), "grid must be an int or up to three ints"),
        (PTX, "scale", dict(block=2048), "block has x = 2048; CUDA allows 1 to 1024"),
        (PTX, "scale", dict(shared_memory=-3), "shared_memory must be a non-negative int"),
        (PTX, "scale", dict(scalars=(1, 2)), "scalars= takes a function"),
    ],
)
def test_bad_options_are_refused_when_the_kernel_is_made(code, entry, options, match):
    with pytest.raises((TypeError, ValueError), match=match):
        jaxbind.cuda_kernel(code, entry, **options)


def test_an_op_with_state_refuses_a_cuda_kernel():
    @jaxbind.state
    def plan(**kw):
        return object()

    kernel = jaxbind.cuda_kernel(PTX, "scale")
    with pytest.raises(TypeError, match="CUDA kernels take no state yet"):
        jaxbind.nonlinear_op(
            shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
            state=plan,
            name="cudak_cpu.stateful",
        )(kernel)
