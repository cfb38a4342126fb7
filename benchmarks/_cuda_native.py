"""The compiled side of the GPU benchmark: the same CUDA kernels as a jaxbind CUDA kernel
and behind a C++ XLA FFI handler (``jax.ffi.ffi_call``), built with nvcc in a temporary
directory, and the command-buffer (CUDA graph) runs, each in a process of its own
(XLA_FLAGS are read once per process).

    python benchmarks/_cuda_native.py graph-child on|off   (run by `graphs`)
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

KERNELS = r"""
extern "C" __global__ void twice4(float4* y, const float4* x, long long n4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
       i += (long long)gridDim.x * blockDim.x) {
    float4 v = x[i];
    y[i] = make_float4(2.f * v.x, 2.f * v.y, 2.f * v.z, 2.f * v.w);
  }
}
extern "C" __global__ void copy(float* y, const float* x, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}
extern "C" __global__ void step(float* y, const float* x, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 1.001f * x[i] + 1e-3f;
}
"""

HANDLERS = r"""
#include "kernels.cu"
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

static long long blocks(long long n) {
  long long b = (n + 255) / 256;
  return b < 132 * 16 ? (b > 0 ? b : 1) : 132 * 16;
}

static ffi::Error Double(cudaStream_t s, ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
  long long n4 = x.element_count() / 4;
  twice4<<<blocks(n4), 256, 0, s>>>(reinterpret_cast<float4*>(y->typed_data()),
                                     reinterpret_cast<const float4*>(x.typed_data()), n4);
  return ffi::Error::Success();
}

static ffi::Error Copy(cudaStream_t s, ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
  long long n = x.element_count();
  copy<<<(n + 255) / 256, 256, 0, s>>>(y->typed_data(), x.typed_data(), n);
  return ffi::Error::Success();
}

static ffi::Error Step(cudaStream_t s, ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
  long long n = x.element_count();
  step<<<(n + 255) / 256, 256, 0, s>>>(y->typed_data(), x.typed_data(), n);
  return ffi::Error::Success();
}

#define BIND                                                                  \
  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()                   \
      .Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>()
XLA_FFI_DEFINE_HANDLER_SYMBOL(BenchDouble, Double, BIND, {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(BenchCopy, Copy, BIND, {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(BenchStep, Step, BIND, {ffi::Traits::kCmdBufferCompatible});
"""


_BUILT = "JAXBIND_BENCH_CUDA_BUILD"


def nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found is None and os.path.exists("/usr/local/cuda/bin/nvcc"):
        found = "/usr/local/cuda/bin/nvcc"
    return found


@functools.cache
def built() -> dict | None:
    """{"ptx": text, "library": path of the FFI handlers' library}, or None without nvcc."""
    where = os.environ.get(_BUILT)  # a parent's build (the command-buffer runs)
    if where:
        with open(os.path.join(where, "kernels.ptx")) as f:
            return dict(ptx=f.read(), library=os.path.join(where, "libhandlers.so"), where=where)
    compiler = nvcc()
    if compiler is None:
        return None
    import jax

    where = tempfile.mkdtemp(prefix="jaxbind-bench-")
    with open(os.path.join(where, "kernels.cu"), "w") as f:
        f.write(KERNELS)
    with open(os.path.join(where, "handlers.cu"), "w") as f:
        f.write(HANDLERS)

    def run(*args):
        done = subprocess.run([compiler, *args], cwd=where, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"nvcc {' '.join(args)} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        return done.returncode == 0

    if not run("-ptx", "-arch=sm_90", "-O3", "kernels.cu", "-o", "kernels.ptx"):
        return None
    handlers = run(
        "-O3",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        "-std=c++17",
        "-arch=sm_90",
        f"-I{jax.ffi.include_dir()}",
        "handlers.cu",
        "-o",
        "libhandlers.so",
    )
    with open(os.path.join(where, "kernels.ptx")) as f:
        ptx = f.read()
    library = os.path.join(where, "libhandlers.so") if handlers else None
    return dict(ptx=ptx, library=library, where=where)


def _blocks(n):
    return max(1, min((n + 255) // 256, 132 * 16))


@functools.cache
def ops() -> dict | None:
    """The jaxbind CUDA kernel ops and the ffi_call functions, by name; None without nvcc."""
    made = built()
    if made is None:
        return None
    import jax

    import jaxbind

    ptx = made["ptx"]
    same = lambda x: ((x.shape, x.dtype),)
    kernels = dict(
        twice4=jaxbind.cuda_kernel(
            ptx,
            "twice4",
            grid=lambda y, x: _blocks(x.size // 4),
            scalars=lambda y, x: (np.int64(x.size // 4),),
        ),
        copy=jaxbind.cuda_kernel(ptx, "copy", scalars=lambda y, x: (np.int64(x.size),)),
        step=jaxbind.cuda_kernel(ptx, "step", scalars=lambda y, x: (np.int64(x.size),)),
    )
    out = {
        f"jaxbind {k}": jaxbind.get_nonlinear_call(
            v, (None, None), same, None, name=f"bench.cuda_{k}"
        )
        for k, v in kernels.items()
    }
    if made["library"] is None or not os.path.exists(made["library"]):
        return out
    lib = ctypes.cdll.LoadLibrary(made["library"])
    for name, symbol in (("twice4", "BenchDouble"), ("copy", "BenchCopy"), ("step", "BenchStep")):
        target = f"bench_{name}"
        jax.ffi.register_ffi_target(
            target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="CUDA"
        )
        out[f"ffi_call {name}"] = functools.partial(_ffi_call, target)
    return out


def _ffi_call(target, x):
    import jax

    return (jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(x.shape, x.dtype))(x),)


def _chain(op, x, calls=100):
    for _ in range(calls):
        x = op(x)[0]
    return x


def graph_child(mode: str, reps: int = 200) -> dict:
    """In a process whose XLA_FLAGS say `mode`: a program of 100 small kernel calls (256
    elements each), per program, for jaxbind's CUDA kernel and the ffi_call handler; and
    how many launches jaxbind's handler made per program (none where XLA replays a
    captured CUDA graph)."""
    import jax
    import jax.numpy as jnp

    made = ops()
    x = jax.device_put(jnp.ones(256, jnp.float32), jax.devices("cuda")[0])
    out = {}
    for impl in ("jaxbind step", "ffi_call step"):
        op = made.get(impl)
        if op is None:
            continue
        f = jax.jit(functools.partial(_chain, op))
        y = f(x)
        jax.block_until_ready(y)
        want = np.ones(256, np.float32)
        for _ in range(100):
            want = np.float32(1.001) * want + np.float32(1e-3)
        ok = bool(np.allclose(np.asarray(y), want, rtol=1e-5))
        from _harness import time_it

        from jaxbind import _ext

        launched = _ext.cuda_kernel_launches()
        timed = time_it(lambda f=f: f(x), iters=reps, warmup=1, rounds=5)
        out[impl] = dict(
            per_program_s=timed.median,
            # jaxbind's handler launches nothing where XLA replays a captured graph (the
            # count covers the untimed run too)
            launches_per_program=(
                (_ext.cuda_kernel_launches() - launched) / (5 * reps + 1)
                if impl.startswith("jaxbind")
                else None
            ),
            correct=ok,
        )
    return out


def graphs() -> dict | None:
    """`graph_child` with command buffers on (FUSION,CUSTOM_CALL) and off, or None."""
    made = built()
    if made is None:
        return None
    results = {}
    for mode, kinds in (("on", "FUSION,CUSTOM_CALL"), ("off", "")):
        env = dict(
            os.environ,
            XLA_FLAGS=f"--xla_gpu_enable_command_buffer={kinds} --xla_gpu_graph_min_graph_size=1",
            **{_BUILT: made["where"]},
        )
        done = subprocess.run(
            [sys.executable, __file__, "graph-child", mode],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            results[mode] = dict(error=done.stderr[-2000:])
            continue
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


if __name__ == "__main__":
    if sys.argv[1:2] == ["graph-child"]:
        print(json.dumps(graph_child(sys.argv[2])))
