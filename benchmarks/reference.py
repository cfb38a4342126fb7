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
   their results against the native program's, in this process.
   (jax.export.deserialize needs flatbuffers, which jax does not install: the venv has it.)
3. Every jaxducc0 op's reference against its native body: a summary of what
   reference_ducc.py wrote (run it first): the range of reference/native time ratios over
   its sizes, and the largest difference.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import alternating, arguments, flag, run_line, run_meta, save  # noqa: E402

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
jax.config.update("jax_enable_x64", True)
for name in sys.argv[2:]:
    blob = open(f"{sys.argv[1]}/{name}.bin", "rb").read()
    count = int(open(f"{sys.argv[1]}/{name}.n").read())
    args = [np.load(f"{sys.argv[1]}/{name}.{i}.npy") for i in range(count)]
    out = jax.export.deserialize(blob).call(*args)
    np.save(f"{sys.argv[1]}/{name}.out.npy", np.asarray(out))
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


def portable(venv: pathlib.Path) -> list[dict]:
    python = fresh_venv(venv)
    rows = []
    with jax.enable_x64(True), tempfile.TemporaryDirectory() as tmp:
        programs = portable_programs()
        expected = {}
        for name, (fn, args, _) in programs.items():
            exported = jaxbind.export(fn, portable=True, platforms=("cpu", "cuda", "tpu"))(*args)
            assert "stablehlo.custom_call" not in exported.mlir_module()
            pathlib.Path(tmp, f"{name}.bin").write_bytes(exported.serialize())
            pathlib.Path(tmp, f"{name}.n").write_text(str(len(args)))
            for i, a in enumerate(args):
                np.save(pathlib.Path(tmp, f"{name}.{i}.npy"), np.asarray(a))
            expected[name] = np.asarray(jax.jit(fn)(*args))  # the native program
        done = subprocess.run(
            [str(python), "-c", _RUN, tmp, *programs], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        environment = ", ".join(done.stdout.split("\n")[-3:-1])
        for name, (_, _, eps) in programs.items():
            got = np.load(pathlib.Path(tmp, f"{name}.out.npy"))
            want = expected[name]
            rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            rows.append(dict(program=name, epsilon=eps, rel_diff=rel, environment=environment))
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
        rows = portable(venv)
        payload["portable"] = rows
        lines += [
            "",
            "## Portable artifacts, run in a fresh venv with JAX only (and flatbuffers)",
            "",
            f"The loading process: {rows[0]['environment']}. Exported for cpu, cuda and tpu "
            "with portable=True (no custom call); run there on the CPU, against the native "
            "program run here (float64).",
            "",
            "| program | op's epsilon | relative L2 difference |",
            "|---|---|---|",
        ]
        for r in rows:
            lines.append(f"| {r['program']} | {r['epsilon']:g} | {r['rel_diff']:.1e} |")
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
