"""Who owns a binding's call sites (docs/sites.md): each site has exactly one owner.

- ``program``: a program compiled in this process owns the sites it calls: its lowering
  keeps a `SiteHolder` alive (`Sites.holder`; the holders are listed here weakly, by the
  call's digest), and making the site puts it in the holder, so the site and its keyword
  arguments go with the last program that calls it. The Instance that finds it holds it
  weakly.
- ``executable``: a program compiled elsewhere (jax.export) has no holder here; where
  XLA keeps the site's Instance in its per-site slot, the executable owns the site
  through it. Such sites are listed weakly (`Sites.loaded`), to be retired when the op
  is defined again.
- ``orphans``: a site of a program compiled elsewhere whose Instance no slot keeps (the
  execute-only door, cpp/execute_only.h: jaxlib 0.7, the CUDA-kernel target) has no
  owner to go with: a small LRU per binding keeps it (``ORPHANS`` at most), and
  ``jax.clear_caches()`` empties it (`forget_orphans`).

The run time asks `Sites.own` for the owner of each site it makes; the lowering asks
`Sites.holder` for the holder a program keeps; the registry hands the holders to a
binding that replaces another (`Sites.hand_over`).
"""

from __future__ import annotations

import collections
import threading
import weakref

__all__ = ["ORPHANS", "SiteHolder", "Sites", "forget_orphans"]

ORPHANS = 64  # sites no program here holds and no executable keeps, per binding

_lock = threading.RLock()
_every: weakref.WeakSet = weakref.WeakSet()  # every binding's Sites, for forget_orphans


class SiteHolder:
    """Keeps one call site alive for as long as a compiled program needs it."""

    __slots__ = ("site", "__weakref__")

    def __init__(self):
        self.site = None


class Sites:
    """The owners of one binding's call sites: its programs' holders, the sites loaded
    executables own, the orphans."""

    __slots__ = ("holders", "loaded", "orphans", "__weakref__")

    def __init__(self):
        self.holders: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.loaded: weakref.WeakSet = weakref.WeakSet()
        self.orphans: collections.OrderedDict = collections.OrderedDict()
        _every.add(self)

    def holder(self, digest: int) -> SiteHolder:
        """The holder of the site `digest`, for a program being lowered to keep alive."""
        with _lock:
            holder = self.holders.get(digest)
            if holder is None:
                holder = self.holders[digest] = SiteHolder()
            return holder

    def own(self, digest: int, site, slot: bool = True) -> tuple:
        """The owner of a site just made: ``(site, owned)``, the site of `digest` (the one
        its programs or the orphans hold already, if any) and whether the Instance that
        finds it owns it (True: a program compiled elsewhere, whose executable keeps the
        Instance in its slot; False: a holder or the orphans do, and the Instance holds
        it weakly). `slot`: whether XLA's slot keeps the Instance."""
        with _lock:
            holder = self.holders.get(digest)
            if holder is not None:
                if holder.site is None:
                    holder.site = site
                return holder.site, False
            if slot:
                self.loaded.add(site)
                return site, True
            kept = self.orphans.setdefault(digest, site)
            self.orphans.move_to_end(digest)
            while len(self.orphans) > ORPHANS:
                self.orphans.popitem(last=False)
            return kept, False

    def drop(self) -> None:
        """Forget every site (the op was defined again): programs make their site again at
        their next call. Sites that holders or the orphans hold go (their cores die with
        them); those that executables own are retired."""
        with _lock:
            for holder in list(self.holders.values()):
                holder.site = None
            self.orphans.clear()
            for site in list(self.loaded):
                site.retire()
            self.loaded.clear()

    def hand_over(self, to: Sites) -> None:
        """Give the holders to the binding that replaces this one: the programs compiled
        for this one then own their new sites as they owned the old ones."""
        with _lock:
            for digest, holder in list(self.holders.items()):
                to.holders.setdefault(digest, holder)

    def live(self) -> dict:
        """The sites alive now that holders or the orphans hold, by digest."""
        with _lock:
            found = {d: h.site for d, h in list(self.holders.items()) if h.site is not None}
            found.update(self.orphans)
            return found

    def owners(self) -> dict:
        """For each live site (by its id), the owners that hold it: "program" (a holder),
        "executable" (loaded), "orphans". Each site has exactly one
        (tests/runtime/test_sites.py)."""
        found: dict = {}
        with _lock:
            for holder in list(self.holders.values()):
                if holder.site is not None:
                    found.setdefault(id(holder.site), []).append("program")
            for site in list(self.loaded):
                found.setdefault(id(site), []).append("executable")
            for site in list(self.orphans.values()):
                found.setdefault(id(site), []).append("orphans")
        return found


def forget_orphans() -> None:
    """Drop every binding's orphans (``jax.clear_caches()``): the programs that called
    them may be gone, and one that is not makes its site again at its next call. A
    stateful op's state goes with its last site."""
    with _lock:
        every = list(_every)
        for sites in every:
            sites.orphans.clear()
