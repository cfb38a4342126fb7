"""The digest route: call sites found by the digest a call carries, where XLA keeps no
per-site slot. Quarantined: everything else finds its site in XLA's slot (see .sites).

Two things still need it, and deleting this module (and cpp/digest_route.h) takes both
gone:
- jaxlib 0.7, whose FFI (API 0.1) gives each slot's object its own deleter; freeing an
  executable with jaxbind's object in its slot aborted the process once in CI, so jaxbind
  sets none there
  (cpp/xla_slot.h, keeps_slots);
- targets that XLA gives no instantiate stage: the CUDA-kernel target, which is declared
  compatible with XLA's command buffers and registered with its execute stage alone
  (_rules/targets.py, the "stages" column), since a captured command buffer replays the
  launch without the handler; whether XLA runs the instantiate stage for such a target
  has not been checked on a GPU.

A site's first call crosses into Python once (`resolve_site`): both steps of .sites in
one crossing; the programs that call such a site own it (Binding.keep_site: their
holder, or the orphan LRU for a loaded program), and the trampoline holds it weakly.
"""

from __future__ import annotations

from .. import _ext
from .._binding import lookup
from .sites import describe_site

__all__ = ["resolve_site"]


def resolve_site(found: dict, ins: tuple, outs: tuple) -> tuple:
    """The ``_ext.Site`` of a call, and what its check says of the call's buffers:
    ``(site, problem or None, kernel address or 0)``."""
    description = describe_site(found)
    binding = lookup(description.binding)
    assert binding is not None  # (describe_site found it)
    site = binding.keep_site(found["site"], _ext.Site(description))
    return (site, *description.accept(ins, outs))
