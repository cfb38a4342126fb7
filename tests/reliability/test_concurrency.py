"""8 threads x 500 calls of different bindings at once: correct, no deadlock, bounded time."""

import threading
import time

import jax
import numpy as np
from support.ops import same_as_first

import jaxbind


def _make(t):
    def f(out, args, kd):
        out[0][...] = args[0] * (t + 1) + jaxbind.load_kwargs(kd)["shift"]

    return jaxbind.get_linear_call(f, None, same_as_first, None, name=f"reliability.thread_{t}")


def test_concurrent_calls_of_different_bindings():
    fns = [jax.jit(lambda x, op=_make(t), t=t: op(x, shift=float(t))[0]) for t in range(8)]
    failures, finished = [], []

    def work(t):
        try:
            x = np.arange(32, dtype=np.float32) + t
            want = x * (t + 1) + t
            for i in range(500):
                y = np.asarray(fns[t](x))
                if not np.array_equal(y, want):
                    failures.append((t, i))
                    return
            finished.append(t)
        except Exception as exc:  # reported by the assertion below
            failures.append((t, repr(exc)))

    start = time.perf_counter()
    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    elapsed = time.perf_counter() - start
    print(f"\n8 threads x 500 calls: {elapsed:.2f} s")
    assert not any(th.is_alive() for th in threads), "deadlock"
    assert not failures and sorted(finished) == list(range(8))
    assert elapsed < 120
