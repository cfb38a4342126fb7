"""The run time watched: what it does with the states of one declaration while
jaxbind.testing.check looks (the family "state", testing/state.py, reads it).

The run time (_runtime.state) tells every watcher registered in ``_state.watchers`` what
it does; nothing at run time imports this module.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from .._state import StateDef, watchers

__all__ = ["Watch", "watching"]


class Watch:
    """What the run time does with the states of one declaration while watched: the
    objects it sets up and tears down, and each use of one by a Python body (with its
    thread and times). Compiled kernels use their state in C++, unseen here."""

    def __init__(self, sdef: StateDef):
        self.sdef = sdef
        self.lock = threading.Lock()
        self.setups: list[int] = []  # id() of each object set up
        self.teardowns: list[int] = []
        # Each use: (id(obj), thread, start, end, id of the run time's state that lent it;
        # setups of two key values may return one object, None say, each under its own lock)
        self.uses: list[tuple[int, int, float, float, int]] = []
        # The objects set up and not torn down yet, by id(), with how many times each is
        # (a setup may return one object several times: None, a shared handle).
        self.kept: dict[int, list] = {}
        self.earlier = 0  # teardowns of objects set up before the watch began
        self.teardown_errors: list[str] = []  # each failed teardown's message
        # The run time's states seen (leased by a call site, set up or used while
        # watched), by id(): what holds an object is the call sites counted by its state
        # (see holders). A site's lease is seen whatever its body, a compiled kernel's too.
        self.states: dict[int, Any] = {}
        self.made: dict[int, int] = {}  # objects each state set up while watched, by id()

    def noted(self, shared, event: str, obj) -> None:
        if shared.sdef is not self.sdef:
            return
        with self.lock:
            self.states[id(shared)] = shared
            if event == "lease":  # a call site took the state (new or set up already)
                return
            if event == "setup":
                self.made[id(shared)] = self.made.get(id(shared), 0) + 1
                self.setups.append(id(obj))
                self.kept.setdefault(id(obj), [obj, 0, shared])[1] += 1
            else:
                self.teardowns.append(id(obj))
                held = self.kept.get(id(obj))
                if held is None:
                    self.earlier += 1
                else:
                    held[1] -= 1
                    if held[1] == 0:
                        del self.kept[id(obj)]

    def left(self) -> tuple[int, int]:
        """Of the objects set up while watched and not torn down yet: how many no call
        site holds any more (leaked), and how many a site still holds (a program alive)."""
        with self.lock:
            held = sum(n for _, n, shared in self.kept.values() if shared.count > 0)
            return sum(n for _, n, _ in self.kept.values()) - held, held

    def used(self, shared, obj, start: float, end: float) -> None:
        if shared.sdef is not self.sdef:
            return
        with self.lock:
            self.states[id(shared)] = shared
            self.uses.append((id(obj), threading.get_ident(), start, end, id(shared)))

    def teardown_failed(self, message: str, shared=None) -> None:
        """A teardown raised: in a program (`shared`, the run time's state), or in a
        direct call (None); `message` names the op and the teardown."""
        if shared is not None and shared.sdef is not self.sdef:
            return
        with self.lock:
            self.teardown_errors.append(message)

    def holders(self, earlier: bool = False) -> list[tuple[str, int]]:
        """The states seen that call sites still hold, with objects set up: each one's
        label (the op and role of the site that set it up) and how many sites hold it.
        `earlier`: only those with an object set up before the watch began."""
        with self.lock:
            states = [(s, self.made.get(i, 0)) for i, s in self.states.items()]
        return [
            (s.label, s.count)
            for s, made in states
            if s.count > 0 and s.objects and (not earlier or len(s.objects) > made)
        ]

    def most_at_once(self) -> int:
        """The most uses of any one object, lent by one state, that overlapped in time."""
        most = 0
        by_object: dict[tuple[int, int], list] = {}
        for obj, _, start, end, lender in self.uses:
            by_object.setdefault((lender, obj), []).append((start, end))
        for spans in by_object.values():
            events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
            now = 0
            for _, step in events:
                now += step
                most = max(most, now)
        return most


@contextlib.contextmanager
def watching(sdef: StateDef) -> Iterator[Watch]:
    """A `Watch` of `sdef`'s states while the block runs."""
    watch = Watch(sdef)
    watchers.append(watch)
    try:
        yield watch
    finally:
        watchers.remove(watch)
