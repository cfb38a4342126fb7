"""Ops with a JAX reference: a multi-platform artifact on the CPU, portable artifacts run
with JAX alone, and the DUCC ops' references against their native bodies.

    python benchmarks/reference.py           # writes benchmarks/results/reference.{json,md}
    python benchmarks/reference.py --quick   # few rounds (the smoke test); no fresh venv

1. Multi-platform export. A program exported for ("cpu", "cuda", "tpu") holds the native
   custom call on CPU and CUDA and the reference on TPU, behind JAX's switch on the
   platform index; on the CPU it must run as fast as the same program exported for
   ("cpu",) alone (target: at most 1.02x). Both artifacts are loaded back and called
   jitted, in alternating rounds.
2. Portable artifacts. `jaxbind.export(..., portable=True)` of a DUCC FFT program and of a
   NUFFT program (and a gradient of each), run by a fresh venv that has JAX
   only (``--fresh-venv DIR``: ``pip install jax==<this jax> flatbuffers``):
   their results against the native program's, in this process. Then the same at real
   sizes (``--real-sizes``): a NUFFT of each type 1 and 2 with 10^6 points on 256^2 (and
   grad in the points of type 1), the gridder with 10^6 visibilities on a 1024^2 image,
   and the SHT at nside 256, lmax 512: each artifact's time per call in the JAX-only
   process (the best of three after a first, compiling call) beside the native program's
   time here, and their difference.
   (jax.export.deserialize needs flatbuffers, which jax does not install: the venv has it.)
3. Every jaxducc0 op's reference against its native body: a summary of what
   reference_ducc.py wrote (run it first): the range of reference/native time ratios over
   its sizes, and the largest difference.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import alternating, arguments, flag, run_line, run_meta, save, time_it  # noqa: E402

import jaxbind  # noqa: E402

# --- 1. a multi-platform artifact on the CPU ------------------------------------------------


def _double(out, args, kd):
    np.multiply(args[0], 2.0, out=out[0])


DOUBLE = jaxbind.get_linear_call(
    _double,
    _double,
    lambda x: ((x.shape, x.dtype),),
    reference=lambda x: 2.0 * x,
    name="benchmarks.reference.double",
)


def multi_platform(rounds: int, iters: int) -> list[dict]:
    rows = []
    for size in (1, 100_000):
        x = jnp.ones(size, jnp.float32)
        program = jax.jit(lambda x: DOUBLE(x)[0])
        loaded = {}
        for label, platforms in (("cpu", ("cpu",)), ("cpu+cuda+tpu", ("cpu", "cuda", "tpu"))):
            blob = jaxbind.export(program, platforms=platforms)(x).serialize()
            fn = jax.jit(jax.export.deserialize(blob).call)
            jax.block_until_ready(fn(x))
            loaded[label] = lambda fn=fn: fn(x)
            compiled = fn.lower(x).compile().as_text()
            branches = "conditional" in compiled  # XLA folds the switch on the platform
        times = alternating(loaded, rounds=rounds, iters=iters, warmup=2)
        ratios = [m / c for c, m in zip(times["cpu"].samples, times["cpu+cuda+tpu"].samples)]
        rows.append(
            dict(
                size=size,
                cpu_s=times["cpu"].median,
                multi_s=times["cpu+cuda+tpu"].median,
                ratio=float(np.median(ratios)),
                conditional=branches,
            )
        )
    return rows


# --- 2. portable artifacts, run by JAX alone --------------------------------------------------

_RUN = """
import json, sys
import numpy as np, jax, jax.export
sys.path.insert(0, sys.argv[1])  # the benchmarks' harness (it imports no jaxbind)
from _harness import time_it
jax.config.update("jax_enable_x64", True)
folder, times = sys.argv[2], {}
for name in sys.argv[3:]:
    blob = open(f"{folder}/{name}.bin", "rb").read()
    count = int(open(f"{folder}/{name}.n").read())
    args = [jax.device_put(np.load(f"{folder}/{name}.{i}.npy")) for i in range(count)]
    call = jax.jit(jax.export.deserialize(blob).call)
    timing = time_it(lambda: call(*args), warmup=1, rounds=3)
    times[name] = timing.min
    np.save(f"{folder}/{name}.out.npy", np.asarray(timing.value))
open(f"{folder}/times.json", "w").write(json.dumps(times))
try:
    import jaxbind  # noqa: F401
    print("jaxbind importable")
except ImportError:
    print("jaxbind not installed")
try:
    import ducc0  # noqa: F401
    print("ducc0 importable")
except ImportError:
    print("ducc0 not installed")
"""


def fresh_venv(path: pathlib.Path) -> pathlib.Path:
    """A venv with JAX only, at `path` (made if missing): jax, its dependencies, and
    flatbuffers, which jax.export.deserialize needs."""
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"jax=={jax.__version__}", "flatbuffers"],
        check=True,
    )
    return python


def portable_programs() -> dict:
    """name -> (function, arguments, epsilon): DUCC FFT and NUFFT programs and gradients."""
    from jaxbind.contrib import jaxducc0

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((32, 32)) + 1j * rng.standard_normal((32, 32)))

    def fft_program(x):
        return jnp.abs(jaxducc0.c2c(x, axes=(0, 1))[0]) ** 2

    def fft_grad(x):
        return jax.grad(lambda x: jnp.sum(jnp.abs(jaxducc0.c2c(x, axes=(0, 1))[0]) ** 4))(x)

    eps = 1e-9
    points = jnp.asarray(rng.uniform(-np.pi, np.pi, (2, 500)))
    values = jnp.asarray(rng.standard_normal(500) + 1j * rng.standard_normal(500))

    def nufft_program(points, values):
        return jaxducc0.nufft1((24, 24), values, points[0], points[1], eps=eps)

    def nufft_grad(points, values):
        def loss(points):
            modes = jaxducc0.nufft1((24, 24), values, points[0], points[1], eps=eps)
            return jnp.sum(jnp.abs(modes) ** 2)

        return jax.grad(loss)(points)

    return {
        "c2c": (fft_program, (x,), 1e-12),
        "c2c_grad": (fft_grad, (x,), 1e-12),
        "nufft1": (nufft_program, (points, values), eps),
        "nufft1_grad_points": (nufft_grad, (points, values), eps),
    }


def real_size_programs() -> dict:
    """name -> (function, arguments, epsilon) at the sizes of issue 64's targets: NUFFTs of
    10^6 points on 256^2, the gridder with 10^6 visibilities on 1024^2, the SHT at nside
    256, lmax 512."""
    from jaxbind.contrib import jaxducc0

    rng = np.random.default_rng(1)
    eps, m, n = 1e-6, 10**6, 256
    points = jnp.asarray(rng.uniform(-np.pi, np.pi, (2, m)))
    values = jnp.asarray(rng.standard_normal(m) + 1j * rng.standard_normal(m))
    modes = jnp.asarray(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))

    def type1(points, values):
        return jaxducc0.nufft1((n, n), values, points[0], points[1], eps=eps)

    def type1_grad_points(points, values):
        loss = lambda p: jnp.sum(jnp.abs(type1(p, values)) ** 2)
        return jax.grad(loss)(points)

    def type2(points, modes):
        return jaxducc0.nufft2(modes, points[0], points[1], eps=eps)

    npix, field, freq = 1024, np.deg2rad(4.0), np.array([1.0e9])
    pixsize = field / npix
    uvw = jnp.asarray((rng.random((m, 3)) - 0.5) / (pixsize * freq[0] / 299792458.0))
    gridder = jaxducc0.get_wgridder(
        pixsize_x=pixsize, pixsize_y=pixsize, npix_x=npix, npix_y=npix, epsilon=eps,
        do_wgridding=True,
    )  # fmt: skip
    image = jnp.asarray(rng.standard_normal((npix, npix)))

    def dirty2vis(uvw, image):
        return gridder(uvw, jnp.asarray(freq), image)[0]

    nside, lmax = 256, 512
    sht = jaxducc0.get_healpix_sht(nside, lmax, lmax, 2)
    alm = jnp.asarray(rng.standard_normal((2, jaxducc0.realalm_size(lmax, lmax))))

    def synthesis(alm):
        return sht(alm)[0]

    return {
        "nufft type 1, 10^6 points, 256^2": (type1, (points, values), eps),
        "nufft type 1 grad points": (type1_grad_points, (points, values), eps),
        "nufft type 2, 10^6 points, 256^2": (type2, (points, modes), eps),
        "wgridder, 10^6 visibilities, 1024^2, w-term": (dirty2vis, (uvw, image), eps),
        "SHT spin 2, nside 256, lmax 512": (synthesis, (alm,), 1e-10),
    }


def _best_of_three(fn, args) -> float:
    jitted = jax.jit(fn)
    return time_it(lambda: jitted(*args), warmup=1, rounds=3).min


def portable(venv: pathlib.Path, make_programs, timed: bool = False) -> list[dict]:
    """Each program of `make_programs()` (made with x64 on: float64 inputs) exported
    portable, run by the JAX-only `venv`, against the native program here; `timed`: with
    both processes' times per call."""
    python = fresh_venv(venv)
    rows = []
    # the loading process sees only its venv: not this checkout's jaxbind (PYTHONPATH)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with jax.enable_x64(True), tempfile.TemporaryDirectory() as tmp:
        programs = make_programs()
        expected, native_s, files = {}, {}, {}
        for index, (name, (fn, args, _)) in enumerate(programs.items()):
            exported = jaxbind.export(fn, portable=True, platforms=("cpu", "cuda", "tpu"))(*args)
            assert "stablehlo.custom_call" not in exported.mlir_module()
            files[name] = stem = f"program{index}"
            pathlib.Path(tmp, f"{stem}.bin").write_bytes(exported.serialize())
            pathlib.Path(tmp, f"{stem}.n").write_text(str(len(args)))
            for i, a in enumerate(args):
                np.save(pathlib.Path(tmp, f"{stem}.{i}.npy"), np.asarray(a))
            expected[name] = np.asarray(jax.jit(fn)(*args))  # the native program
            if timed:
                native_s[name] = _best_of_three(fn, args)
        done = subprocess.run(
            [str(python), "-c", _RUN, str(HERE), tmp, *files.values()],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        environment = ", ".join(done.stdout.split("\n")[-3:-1])
        jax_only_s = json.loads(pathlib.Path(tmp, "times.json").read_text())
        for name, (_, _, eps) in programs.items():
            got = np.load(pathlib.Path(tmp, f"{files[name]}.out.npy"))
            want = expected[name]
            rel = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            row = dict(program=name, epsilon=eps, rel_diff=rel, environment=environment)
            if timed:
                row.update(native_s=native_s[name], jax_only_s=jax_only_s[files[name]])
            rows.append(row)
    return rows


# --- 3. every jaxducc0 op's reference: a summary of the script that times them ------------------

DETAILS = ("reference_ducc",)


def contrib(out: pathlib.Path) -> list[dict]:
    """Per op and case (forward, grad): the range of reference/native time ratios over the
    sizes, and the largest difference, from the results reference_ducc.py wrote."""
    summary: dict[tuple, dict] = {}
    for stem in DETAILS:
        path = out / f"{stem}.json"
        if not path.exists():
            continue
        for r in json.loads(path.read_text())["results"]:
            key = (r["op"], r["case"])
            row = summary.setdefault(key, dict(op=r["op"], case=r["case"], source=stem, sizes=[]))
            row["sizes"].append(r["size"])
            row["ratio_min"] = min(row.get("ratio_min", np.inf), r["ratio"])
            row["ratio_max"] = max(row.get("ratio_max", 0.0), r["ratio"])
            row["agree_max"] = max(row.get("agree_max", 0.0), r["agree"])
    return list(summary.values())


def main():
    args = arguments(
        __doc__,
        flag("--fresh-venv", default=None, help="a venv with JAX only (made if missing)"),
        flag("--real-sizes", action="store_true", help="also the artifacts at real sizes"),
    )
    rounds = args.rounds or (4 if args.quick else 40)
    iters = 20 if args.quick else 400
    meta = run_meta()
    multi = multi_platform(rounds, iters)
    lines = [
        f"{run_line(meta)}.",
        "",
        "## A program exported for cpu, cuda and tpu, run on the CPU",
        "",
        f"{rounds} alternating rounds of {iters} calls; the ratio is the median of the "
        "rounds' ratios (target: at most 1.02).",
        "",
        "| elements | exported for cpu | for cpu, cuda, tpu | ratio | platform switch left "
        "in the compiled program |",
        "|---|---|---|---|---|",
    ]
    for r in multi:
        lines.append(
            f"| {r['size']} | {r['cpu_s'] * 1e6:.2f} µs | {r['multi_s'] * 1e6:.2f} µs | "
            f"{r['ratio']:.3f} | {'yes' if r['conditional'] else 'no (folded by XLA)'} |"
        )
    payload = dict(meta=meta, multi_platform=multi)
    if not args.quick:
        venv = pathlib.Path(args.fresh_venv or pathlib.Path(tempfile.gettempdir(), "jax-only"))
        rows = portable(venv, portable_programs)
        payload["portable"] = rows
        lines += [
            "",
            "## Portable artifacts, run in a fresh venv with JAX only (and flatbuffers)",
            "",
            f"The loading process: {rows[0]['environment']}. Exported for cpu, cuda and tpu "
            "with portable=True (no custom call); run there on the CPU, against the native "
            "program run here (float64).",
            "",
            "| program | op's epsilon | largest difference (relative to the largest element) |",
            "|---|---|---|",
        ]
        for r in rows:
            lines.append(f"| {r['program']} | {r['epsilon']:g} | {r['rel_diff']:.1e} |")
        if args.real_sizes:
            big = portable(venv, real_size_programs, timed=True)
            payload["portable_real_sizes"] = big
            lines += [
                "",
                "### At real sizes",
                "",
                "Each artifact's time per call in the JAX-only process (best of three after "
                "a first call) beside the native program's here (DUCC, one thread), "
                "float64, on the CPU.",
                "",
                "| program | epsilon | native | portable, JAX only | ratio | largest difference |",
                "|---|---|---|---|---|---|",
            ]
            for r in big:
                lines.append(
                    f"| {r['program']} | {r['epsilon']:g} | {r['native_s']:.2f} s | "
                    f"{r['jax_only_s']:.2f} s | {r['jax_only_s'] / r['native_s']:.1f} | "
                    f"{r['rel_diff']:.1e} |"
                )
    ops = contrib(pathlib.Path(args.out))
    if ops:
        payload["contrib"] = ops
        lines += [
            "",
            "## Each jaxducc0 op's reference against its native body",
            "",
            "A summary of " + " and ".join(f"[{s}.md]({s}.md)" for s in DETAILS) + " (every "
            "size, the times, the epsilons): reference time / native time over the sizes "
            "measured, and the largest relative L2 difference of the outputs.",
            "",
            "| op | case | sizes | reference / native | largest difference |",
            "|---|---|---|---|---|",
        ]
        for r in ops:
            lines.append(
                f"| {r['op']} | {r['case']} | {len(r['sizes'])} | {r['ratio_min']:.1f} to "
                f"{r['ratio_max']:.1f} | {r['agree_max']:.1e} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    save(args.out, "reference", json.loads(json.dumps(payload, default=str)), text)


if __name__ == "__main__":
    main()
