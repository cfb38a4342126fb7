"""A jaxbind program without Python: per call, a C PJRT host (demos/run_bundle.c) running a
bundle whose op is a C kernel (jaxbind's C runtime), the same host running the portable
form (the op's reference, no custom call), and JAX running the program in Python.

    python benchmarks/pjrt_host.py           # writes benchmarks/results/pjrt_host.*
    python benchmarks/pjrt_host.py --quick   # fewer runs (not for the record)

The program takes 8 float32 values: ``tanh(op(x)) + 1`` with ``op(x) = 2 x + 1``, a C
kernel (built here against jaxbind/kernel.h) with the JAX reference ``2 * x + 1``. The
host: a CPU PJRT plugin (JAXBIND_PJRT_PLUGIN, or fastatomstruct-xla-cpu's) and the PJRT C
API header (JAXBIND_PJRT_INCLUDE, or xla-cpu-pjrt's): ``pip install ".[pjrt]"``. A host
process runs ``--repeat`` executions (each: execute, wait for it, free its output) after one
untimed, and prints its mean time per run; the native and portable bundles alternate (A B,
B A, ...) over ``--rounds`` processes each, and each row is the median over them. JAX's
rows time ``jax.jit`` of the same program in this process (the C kernel through jaxbind's
trampoline; the reference), per call with the result waited for, alternating likewise.
Targets (docs/without-python.md): the runtime within 1.5 µs of the portable form, and
below JAX's per-call time.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _harness import alternating, arguments, flag, run_line, run_meta, save  # noqa: E402

import jaxbind  # noqa: E402

KERNEL = r"""
#include "jaxbind/kernel.h"
int32_t affine(const jaxbind_call *call) {  /* out = 2 x + 1, float32 */
  const float *x = (const float *)call->inputs[0].data;
  float *y = (float *)call->outputs[0].data;
  int64_t n = 1;
  for (int64_t d = 0; d < call->inputs[0].rank; ++d) n *= call->inputs[0].dims[d];
  for (int64_t i = 0; i < n; ++i) y[i] = 2.0f * x[i] + 1.0f;
  return 0;
}
"""


def main() -> None:
    args = arguments(
        __doc__,
        flag("--repeat", type=int, default=20000, help="executions per host process"),
        rounds=9,
    )
    if args.quick:
        args.repeat, args.rounds = 300, 2
    from tests.support.pjrt_host import compile_driver, compiler, include_dir, plugin_path

    plugin, include, cc = plugin_path(), include_dir(), compiler()
    if plugin is None or include is None or cc is None:
        print(
            "pjrt_host: needs a C compiler, a CPU PJRT plugin and pjrt_c_api.h: "
            'pip install ".[pjrt]" (or set JAXBIND_PJRT_PLUGIN and JAXBIND_PJRT_INCLUDE)'
        )
        sys.exit(0 if args.quick else 1)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="jaxbind-pjrt-bench-"))
    (tmp / "affine.c").write_text(KERNEL)
    include_jaxbind = f"-I{jaxbind.kernel_include_dir()}"
    subprocess.run(
        [
            cc,
            "-O2",
            "-shared",
            "-fPIC",
            include_jaxbind,
            str(tmp / "affine.c"),
            "-o",
            str(tmp / "libaffine.so"),
        ],
        check=True,
    )
    driver = compile_driver(cc, include, tmp)

    lib = ctypes.CDLL(str(tmp / "libaffine.so"))
    op = jaxbind.nonlinear_op(
        shape=lambda x: x, reference=lambda x: 2 * x + 1, name="bench.pjrt_affine"
    )(jaxbind.kernel(lib.affine))
    f = lambda x: jnp.tanh(op(x)) + 1
    x = np.linspace(-1.0, 1.0, 8).astype(np.float32)
    bundles = {
        "C host, jaxbind runtime (C kernel)": jaxbind.bundle(f, x, path=tmp / "native"),
        "C host, portable form (reference)": jaxbind.bundle(
            f, x, path=tmp / "portable", portable=True
        ),
    }
    x.tofile(tmp / "x.bin")

    def host(bundle: str) -> tuple[float, float]:
        done = subprocess.run(
            [str(driver), plugin, bundle, str(tmp / "x.bin"), "--repeat", str(args.repeat)],
            capture_output=True,
            text=True,
            check=True,
        )
        found = re.search(r"per run: ([\d.]+) us, CPU ([\d.]+) us", done.stdout)
        return float(found.group(1)) * 1e-6, float(found.group(2)) * 1e-6

    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in bundles}
    for r in range(args.rounds):
        for name in bundles if r % 2 == 0 else reversed(list(bundles)):
            samples[name].append(host(bundles[name]))

    native = jax.jit(f)
    with jaxbind.use_reference():
        reference = jax.jit(f)
        reference(x).block_until_ready()
    native(x).block_until_ready()
    timings = alternating(
        {
            "JAX, jax.jit (C kernel by jaxbind's trampoline)": lambda: native(x),
            "JAX, jax.jit (reference)": lambda: reference(x),
        },
        rounds=args.rounds,
        iters=max(args.repeat // 10, 100),
        warmup=10,
    )
    rows = [
        dict(
            impl=name,
            median_s=statistics.median(w for w, _ in s),
            cpu_median_s=statistics.median(c for _, c in s),
            samples_s=s,
        )
        for name, s in samples.items()
    ]
    rows += [
        dict(impl=name, median_s=t.median, cpu_median_s=t.cpu_median, samples_s=list(t.samples))
        for name, t in timings.items()
    ]
    median = {r["impl"]: (r["median_s"], r["cpu_median_s"]) for r in rows}
    (runtime_s, runtime_cpu), (portable_s, portable_cpu) = (median[name] for name in bundles)
    meta = run_meta(
        plugin=os.path.basename(plugin),
        repeat=args.repeat,
        rounds=args.rounds,
        load=os.getloadavg()[0],
    )
    lines = [
        f"{run_line(meta)}; plugin {meta['plugin']}, load average {meta['load']:.1f}. Per call "
        f"of an 8-element program, median of {args.rounds} rounds.",
        "",
        "| how the program runs | per call (µs) | CPU per call (µs) |",
        "|---|---|---|",
        *[
            f"| {r['impl']} | {r['median_s'] * 1e6:.2f} | {r['cpu_median_s'] * 1e6:.2f} |"
            for r in rows
        ],
        "",
        f"The runtime's call costs {1e6 * (runtime_s - portable_s):+.2f} µs "
        f"({1e6 * (runtime_cpu - portable_cpu):+.2f} µs of CPU) against the portable form in "
        "the same host (target: at most +1.5 µs). CPU time counts every thread of the process "
        "(XLA's included): on a loaded machine, wall time is mostly waiting to be scheduled.",
        "",
    ]
    save(args.out, "pjrt_host", dict(meta=meta, results=rows), "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
