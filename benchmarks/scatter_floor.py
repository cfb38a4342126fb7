"""What XLA's CPU scatter allows a NUFFT of type 1 written in JAX: the floor under the
reference's time.

    python benchmarks/scatter_floor.py           # 10^6 points on 256² (512² oversampled)
    python benchmarks/scatter_floor.py --quick   # 10^4 points on 64², one round; no file

Side by side in alternating rounds, jit-compiled, float64, eps 1e-6 (kernel width w = 8,
two real channels: a complex value):

- DUCC: ``jaxducc0.nufft_points`` type 1, one thread (the whole transform);
- reference: its JAX reference (`reference.spreading.type1`, the whole transform);
- scatter alone: the reference's scatter-add loop and nothing else: the same chunks of
  points, the same ``w x w x 2`` windows (fixed values, not the kernel), the same
  padded grid; no kernel evaluation, no FFT, no deconvolution.

Any type 1 that adds each point's window into a grid with XLA's scatter costs at least
"scatter alone"; the ratio floor / DUCC bounds from below what the reference can reach
by that design on this machine.
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import alternating, arguments, publish, run_line, run_meta, table  # noqa: E402
from jax import lax  # noqa: E402

from jaxbind.contrib import jaxducc0  # noqa: E402
from jaxbind.contrib.ducc.reference import spreading  # noqa: E402

EPS = 1e-6


def scatter_alone(points: int, over: int, w: int, chunk: int = spreading.CHUNK):
    """The reference's scatter loop with fixed windows: (channels (M, 2), starts (M, 2))
    -> the padded grid."""
    count = -(-points // chunk)
    dims = lax.ScatterDimensionNumbers(
        update_window_dims=(1, 2, 3), inserted_window_dims=(), scatter_dims_to_operand_dims=(0, 1)
    )
    window = jnp.ones((chunk, w, w, 2))

    def run(channels, starts):
        channels = jnp.pad(channels, ((0, count * chunk - points), (0, 0)))
        starts = jnp.pad(starts, ((0, count * chunk - points), (0, 0)))

        def step(grid, block):
            c, s = block
            mode = lax.GatherScatterMode.PROMISE_IN_BOUNDS
            return lax.scatter_add(grid, s, window * c[:, None, None, :], dims, mode=mode), None

        blocks = (channels.reshape(count, chunk, 2), starts.reshape(count, chunk, 2))
        grid, _ = lax.scan(step, jnp.zeros((over + w - 1, over + w - 1, 2)), blocks)
        return grid

    return run


def main():
    args = arguments(__doc__, rounds=5)
    points, modes = (10**4, 64) if args.quick else (10**6, 256)
    rounds = 1 if args.quick else args.rounds
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.uniform(-np.pi, np.pi, (2, points)))
    values = jnp.asarray(rng.normal(size=(1, points)) + 1j * rng.normal(size=(1, points)))
    w = spreading.kernel_width(EPS, False)
    over = spreading.oversampled(modes, w)
    channels = jnp.stack([values[0].real, values[0].imag], axis=1)
    starts = jnp.asarray(rng.integers(0, over, (points, 2)), jnp.int32)
    ducc = jax.jit(
        lambda v, x: jaxducc0.nufft_points(
            v, x, nufft_type=1, grid=(modes, modes), sign=-1, eps=EPS, nthreads=1
        )[0]
    )
    reference = jax.jit(lambda v, x: spreading.type1(v, x, (modes, modes), sign=-1, eps=EPS))
    floor = jax.jit(scatter_alone(points, over, w))
    times = alternating(
        {
            "DUCC": lambda: ducc(values, xs),
            "reference": lambda: reference(values, xs),
            "scatter alone": lambda: floor(channels, starts),
        },
        rounds=rounds,
        warmup=1,
    )
    base = times["DUCC"].median
    meta = run_meta(ducc_threads=1, kernel_width=w, oversampled=over)
    rows = [dict(what=k, median_s=t.median, ratio=t.median / base) for k, t in times.items()]
    caption = (
        f"{run_line(meta)}; {points} points on {modes}² ({over}² oversampled), float64, "
        f"eps {EPS:g} (w = {w}, {w * w * 2} real updates per point); medians of {rounds} "
        "alternating rounds (jitted). 'scatter alone' is the reference's scatter-add loop "
        "with fixed windows: no kernel, no FFT, no deconvolution."
    )
    cells = [(r["what"], f"{r['median_s']:.4f}", f"{r['ratio']:.1f}") for r in rows]
    lines = [
        "# The scatter floor of a type 1 NUFFT in JAX",
        "",
        *table(caption, ("what", "median (s)", "/ DUCC"), cells),
    ]
    publish(args.out, "scatter_floor", dict(meta=meta, results=rows), lines, write=not args.quick)


if __name__ == "__main__":
    main()
