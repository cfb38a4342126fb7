"""Python threads that run one function at once."""

from __future__ import annotations

import threading
from collections.abc import Callable


def failures_at_once(work: Callable[[int], None], n: int) -> list[BaseException]:
    """Run work(0) .. work(n - 1), each on a thread of its own, all at once; returns the
    exceptions they raised (none: an empty list)."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except Exception as exc:  # reported to the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
