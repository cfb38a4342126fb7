"""Concurrent calls from Python threads: correct results, no deadlock."""

import threading

import jax
import jax.numpy as jnp
import numpy as np

import jaxbind


def _make(scale):
    def f(out, args, kwargs_dump):
        k = jaxbind.load_kwargs(kwargs_dump)["offset"]
        out[0][...] = scale * args[0] + k

    return jaxbind.get_linear_call(
        f, None, lambda x, **k: ((x.shape, x.dtype),), None, name=f"tests.threaded_{scale}"
    )


def test_eight_threads_two_hundred_calls_each():
    ops = [_make(s) for s in range(1, 9)]
    fns = [jax.jit(lambda x, op=op, k=k: op(x, offset=float(k))[0]) for k, op in enumerate(ops)]
    errors, done = [], []

    def work(t):
        try:
            x = jnp.arange(16.0) + t
            for i in range(200):
                y = fns[t](x)
                expected = (t + 1) * (np.arange(16.0) + t) + t
                if not np.allclose(y, expected):
                    errors.append((t, i))
                    return
            done.append(t)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append((t, repr(exc)))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "deadlock: threads still running"
    assert not errors
    assert sorted(done) == list(range(8))
