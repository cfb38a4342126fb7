"""Pickling ops by reference, as Python pickles functions: an op is its module and its
name there, and unpickling imports the module and takes the op it defines (in another
process, the op that process defines; multiprocessing, joblib and dask pickle functions
that hold ops this way). An op no module holds under a name (made inside a function, in
a loop, or kept only in a container) cannot be pickled: `reduce` says so, naming it.

Both APIs' ops (_api.Op, the pytree API's PytreeOp) pickle through `reduce`.
"""

from __future__ import annotations

import importlib
import pickle
import sys
from collections.abc import Iterable

from ._errors import about

__all__ = ["caller_module", "load", "reduce"]


def caller_module(depth: int) -> str | None:
    """The module of the code `depth` frames above the caller (where an op is made)."""
    try:
        return sys._getframe(depth + 1).f_globals.get("__name__")
    except ValueError:  # no such frame
        return None


def reduce(op, name: str, places: Iterable[tuple[str | None, str | None]]) -> tuple:
    """What pickle stores for `op` (named `name`): ``(load, (module, qualified name))``
    for the first of `places` (``(module, qualified name or None)``; None: any name of
    the module) that holds it; a PicklingError naming the op if none does."""
    looked = []
    for module_name, qualname in places:
        module = sys.modules.get(module_name) if module_name else None
        if module is None or module_name in looked:
            continue
        looked.append(module_name)
        if qualname is not None and _find(module, qualname) is op:
            return load, (module_name, qualname)
        for key, value in list(vars(module).items()):
            if value is op:
                return load, (module_name, key)
    where = " or ".join(f"module {m!r}" for m in looked) or "any module"
    raise pickle.PicklingError(
        f"{about(name)} cannot be pickled: jaxbind pickles an op by reference, as Python "
        f"pickles a function (its module and its name there), and no top-level name of "
        f"{where} holds it (an op made inside a function, in a loop, or kept only in a "
        "container). Define the op at the top level of a module that the unpickling "
        "process can import, or pickle the function that makes it and its arguments"
    )


def load(module: str, qualname: str):
    """The op `qualname` of `module` (imported here if it is not yet): what `reduce`
    stores."""
    found = _find(importlib.import_module(module), qualname)
    if getattr(found, "binding", None) is None:
        raise pickle.UnpicklingError(
            f"jaxbind: the pickled op {module}.{qualname} is not a jaxbind op in this "
            f"process (found {type(found).__name__}): define it there as where it was pickled"
        )
    return found


def _find(module, qualname: str):
    found = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found
