"""A pytree-API op's call against the same op through the JAXbind 1.3 API, side by side.

    python benchmarks/pytree_call.py            # writes benchmarks/results/pytree_call.{json,md}
    python benchmarks/pytree_call.py --rounds 9
    python benchmarks/pytree_call.py --quick    # 3 rounds, short loops (the smoke test)

Each case is one op written three ways: the 1.3 API's body (``out[0][...] = ...``), a
pytree-API body that writes into ``out=`` (``out[...] = ...``), and one that returns its
result. They run alternating in one process (A B C, C B A, ...), in two modes: `loop`, a
jitted ``fori_loop`` of --calls calls (the run time: trampoline, site, body), and `eager`,
one call from Python (dispatch too). A sample is the time per call of a round; the table
gives the medians over rounds and the paired difference of each native form from the 1.3
body, round by round (median and interquartile range).

- `double`: ``2 * x`` on one float32, no keyword arguments;
- `pair`: ``k * (a + b)`` on 16 floats with ``k=2.0``; the native op takes ``{"a": a, "b":
  b}`` (a dict), the 1.3 op two arrays.
"""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
from _harness import alternating, arguments, flag, run_line, run_meta, save

import jaxbind


def _1_3(body):
    return jaxbind.get_linear_call(
        body, body, lambda *xs, **kw: ((xs[0].shape, xs[0].dtype),), name=f"bench.{body.__name__}"
    )


def double13(out, args, kwargs_dump):
    out[0][...] = 2 * args[0]


def pair13(out, args, kwargs_dump):
    out[0][...] = jaxbind.load_kwargs(kwargs_dump)["k"] * (args[0] + args[1])


def _like(x, **kw):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _like_a(d, **kw):
    return jax.ShapeDtypeStruct(d["a"].shape, d["a"].dtype)


@jaxbind.linear_op(shape=_like, name="bench.double_out")
def double_out(x, *, out):
    out[...] = 2 * x


@jaxbind.linear_op(shape=_like, name="bench.double_returns")
def double_returns(x):
    return 2 * x


@jaxbind.linear_op(shape=_like_a, name="bench.pair_out")
def pair_out(d, *, k=1.0, out):
    out[...] = k * (d["a"] + d["b"])


@jaxbind.linear_op(shape=_like_a, name="bench.pair_returns")
def pair_returns(d, *, k=1.0):
    return k * (d["a"] + d["b"])


FORMS = ("1.3 API", "native, out=", "native, returns")


def _cases():
    """Per case: its argument, and each form's call on it (the same result)."""
    x = jnp.zeros(1, jnp.float32)
    d = {"a": jnp.zeros(16, jnp.float32), "b": jnp.zeros(16, jnp.float32)}
    op13, p13 = _1_3(double13), _1_3(pair13)
    return {
        "double": (
            x,
            {
                FORMS[0]: lambda x: op13(x)[0],
                FORMS[1]: double_out,
                FORMS[2]: double_returns,
            },
        ),
        "pair": (
            d,
            {
                FORMS[0]: lambda d: {"a": p13(d["a"], d["b"], k=2.0)[0], "b": d["b"]},
                FORMS[1]: lambda d: {"a": pair_out(d, k=2.0), "b": d["b"]},
                FORMS[2]: lambda d: {"a": pair_returns(d, k=2.0), "b": d["b"]},
            },
        ),
    }


def measure(case, arg, calls_of, mode, rounds, calls, iters):
    if mode == "loop":
        variants = {}
        for form, call in calls_of.items():
            body = lambda i, y, call=call: call(y)
            loop = jax.jit(lambda x, body=body: jax.lax.fori_loop(0, calls, body, x))
            variants[form] = lambda loop=loop: loop(arg)
        per_call = calls
    else:
        variants = {form: (lambda call=call: call(arg)) for form, call in calls_of.items()}
        per_call = 1
    for fn in variants.values():
        jax.block_until_ready(fn())
    times = alternating(variants, rounds=rounds, iters=iters, warmup=2)
    row = dict(case=case, mode=mode, rounds=rounds, calls_per_round=iters * per_call)
    for form in FORMS:
        wall = [s / per_call for s in times[form].samples]
        cpu = [s / per_call for s in times[form].cpu]
        row[form] = dict(median_s=statistics.median(wall), samples_s=wall, cpu_samples_s=cpu)
    for form in FORMS[1:]:  # paired, round by round, with the 1.3 body
        for clock, key in (("", "samples_s"), ("cpu_", "cpu_samples_s")):
            diffs = [a - b for a, b in zip(row[form][key], row[FORMS[0]][key])]
            q = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else [diffs[0]] * 3
            row[form].update(
                {f"{clock}diff_s": statistics.median(diffs), f"{clock}diff_q1_s": q[0]}
            )
            row[form][f"{clock}diff_q3_s"] = q[2]
    return row


def main():
    args = arguments(
        __doc__,
        flag("--calls", type=int, default=None, help="calls per jitted fori_loop"),
    )
    rounds = args.rounds or (3 if args.quick else 21)
    calls = args.calls or (20 if args.quick else 1000)
    rows = []
    for case, (arg, calls_of) in _cases().items():
        for mode, iters in (("loop", 2 if args.quick else 5), ("eager", 20 if args.quick else 300)):
            rows.append(measure(case, arg, calls_of, mode, rounds, calls, iters))
    meta = run_meta()
    us = lambda s: f"{s * 1e6:.2f} µs"
    lines = [
        f"{run_line(meta)}. {rounds} alternating rounds per row; a jitted loop runs {calls} "
        "calls. Per call: medians over rounds of the wall time; native − 1.3: the paired "
        "difference, median (interquartile range), in wall time and in this process's CPU "
        "time (less disturbed by other processes on a shared machine).",
        "",
        "| case | mode | 1.3 API | native, out= | native, returns | out= − 1.3 | out= − 1.3, CPU "
        "| returns − 1.3 | returns − 1.3, CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [us(r[f]["median_s"]) for f in FORMS]
        for f in FORMS[1:]:
            for clock in ("", "cpu_"):
                d = r[f]
                cells.append(
                    f"{d[clock + 'diff_s'] * 1e6:+.2f} ({d[clock + 'diff_q1_s'] * 1e6:+.2f} to "
                    f"{d[clock + 'diff_q3_s'] * 1e6:+.2f}) µs"
                )
        lines.append(f"| {r['case']} | {r['mode']} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        save(args.out, "pytree_call", dict(meta=meta, results=rows), text)


if __name__ == "__main__":
    main()
