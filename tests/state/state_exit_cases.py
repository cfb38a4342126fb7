"""A state's teardown never runs after the interpreter has begun to exit (docs/state.md),
run in a subprocess by test_state_exit.py: `python state_exit_cases.py CASE` prints, in
order, "TEARDOWN" for each teardown, "MAIN ENDS" when its main thread ends and "EXIT
BEGAN" from an atexit hook (which runs before jaxbind's and JAX's, registered earlier).

Cases:
- ``daemon_threads``: daemon threads keep calling a jitted program whose "lock" state
  one of them holds, and the main thread ends: no teardown after it (JAX's own atexit
  hook frees the executable);
- ``quiet``: the same program, no threads;
- ``worker``: a non-daemon thread that the interpreter waits for drops the program after
  the main thread ended, before exit begins: its teardown runs (the control).
"""

import atexit
import os
import sys
import threading
import time

import jax
import jax.numpy as jnp

import jaxbind

KEPT: list = []


def say(text: str) -> None:
    os.write(1, f"{text}\n".encode())  # unbuffered, from any thread, at any time


def main(case: str) -> None:
    @jaxbind.state(concurrency="lock", teardown=lambda obj: say("TEARDOWN"))
    def plan():
        return {"calls": 0}

    def f(out, args, kwargs_dump):
        jaxbind.load_state(kwargs_dump)["calls"] += 1
        time.sleep(0.002)
        out[0][...] = 2 * args[0]

    same = lambda x, **kw: ((x.shape, x.dtype),)
    op = jaxbind.get_linear_call(f, f, same, name="exit_cases.doubling", state=plan)
    program = jax.jit(lambda x: op(x)[0])
    x = jnp.ones(3)
    program(x).block_until_ready()
    KEPT.append(program)  # alive until exit: JAX's atexit hook frees its executable
    atexit.register(lambda: say("EXIT BEGAN"))

    def forever():
        while True:
            program(x).block_until_ready()

    if case == "daemon_threads":
        for _ in range(3):
            threading.Thread(target=forever, daemon=True).start()
        time.sleep(0.2)
    elif case == "worker":

        def drop_later():
            time.sleep(0.3)  # after the main thread ended
            KEPT.clear()
            jax.clear_caches()
            say("WORKER CLEARED")

        threading.Thread(target=drop_later).start()
    say("MAIN ENDS")


if __name__ == "__main__":
    main(sys.argv[1])
