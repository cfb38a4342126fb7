"""JAXbind 1.3's keyword arguments: a pickled dict, as bytes or as a uint8 NumPy array.

Only `jaxbind.load_kwargs` reads them, for callables written for JAXbind 1.3 that are
handed such a dump by their own code. Deleting this module, and its one use in
load_kwargs, is what dropping that compatibility takes.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

__all__ = ["load"]


def load(kwargs_dump) -> dict[str, Any] | None:
    """The dict that JAXbind 1.3 pickled into `kwargs_dump`, or None for anything else."""
    if isinstance(kwargs_dump, np.ndarray) and kwargs_dump.dtype == np.uint8:
        return dict(pickle.loads(kwargs_dump.tobytes()))
    if isinstance(kwargs_dump, (bytes, bytearray)):
        return dict(pickle.loads(bytes(kwargs_dump)))
    return None
