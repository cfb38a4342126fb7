"""NumPy dtypes in the keyword-argument encoding: a dtype's JSON form and back.

A dtype is written as its .str ("<f8", "|S3", "<M8[s]"), an ml_dtypes name
("bfloat16"), [dtype, shape] for a subarray, or {names, formats, offsets, itemsize[,
titles, aligned]} for a structured one. Only dtypes whose bits mean the same number
everywhere are data: no object dtype, no long double, no metadata.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["NotData", "dtype_code", "dtype_from", "smallest_normal"]


class NotData(TypeError):
    """A value that the data-only encoding cannot represent."""


def dtype_code(dtype: np.dtype, path: str):
    """A dtype's JSON form, or NotData (`path` names the value in the message)."""
    if dtype.metadata is not None:
        raise NotData(f"{path}: NumPy dtype {dtype} carries metadata")
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return [dtype_code(base, path), list(shape)]
    if dtype.names is not None:
        fields: list[tuple] = [dtype.fields[name] for name in dtype.names]  # type: ignore[index]
        titles = [field[2] if len(field) > 2 else None for field in fields]
        if any(title is not None and type(title) is not str for title in titles):
            raise NotData(f"{path}: NumPy dtype {dtype} has titles that are not strings")
        code: dict[str, Any] = {
            "names": list(dtype.names),
            "formats": [dtype_code(field[0], path) for field in fields],
            "offsets": [field[1] for field in fields],
            "itemsize": dtype.itemsize,
        }
        if any(title is not None for title in titles):
            code["titles"] = titles
        if dtype.isalignedstruct:
            code["aligned"] = True
        return code
    ml = _ml_names().get(dtype.type)
    if ml is not None:
        return ml
    if (
        dtype.kind not in "biufcmMSUV"
        or dtype.char in "gG"  # long double: its bits mean different numbers elsewhere
        or (dtype.kind == "V" and dtype.type is not np.void)
    ):
        raise NotData(f"{path}: NumPy dtype {dtype} is not plain data")
    return dtype.str


def dtype_from(code) -> np.dtype:
    """The dtype of a JSON form made by dtype_code (and no other: checked)."""
    if isinstance(code, str):
        if code[:1] in ("<", ">", "|", "="):
            dtype = np.dtype(code)
        elif code in _ml_dtypes():
            dtype = _ml_dtypes()[code]
        else:
            raise ValueError(f"jaxbind: keyword arguments hold an unknown dtype {code!r}")
    elif isinstance(code, list) and len(code) == 2:
        dtype = np.dtype((dtype_from(code[0]), tuple(code[1])))
    elif isinstance(code, dict):
        spec: Any = {
            key: code[key] for key in ("names", "offsets", "itemsize", "titles") if key in code
        }
        spec["formats"] = [dtype_from(f) for f in code["formats"]]
        dtype = np.dtype(spec, align=bool(code.get("aligned")))
    else:
        raise ValueError(f"jaxbind: keyword arguments hold a malformed dtype {code!r}")
    try:
        dtype_code(dtype, "")  # no object dtype, nothing but data
    except NotData:
        raise ValueError(
            f"jaxbind: keyword arguments hold an array of dtype {dtype}, which is not plain data"
        ) from None
    return dtype


@functools.cache
def smallest_normal(dtype: np.dtype) -> Any:
    """The smallest normal magnitude of a floating dtype (None for others)."""
    if dtype.type in _ml_names():  # (some have kind "f", but NumPy's finfo knows none)
        import ml_dtypes

        try:
            return ml_dtypes.finfo(dtype).smallest_normal
        except ValueError:  # an integer type
            return None
    if dtype.kind in "fc":
        return np.finfo(dtype).smallest_normal
    return None


@functools.cache
def _ml_dtypes() -> dict[str, np.dtype]:
    """ml_dtypes' scalar types (bfloat16, float8_*, int4, ...) by name."""
    import ml_dtypes

    found = {}
    for name in dir(ml_dtypes):
        kind = getattr(ml_dtypes, name)
        if isinstance(kind, type) and issubclass(kind, np.generic):
            found[name] = np.dtype(kind)
    return found


@functools.cache
def _ml_names() -> dict[type, str]:
    """The names of ml_dtypes' scalar types (dtype.name costs microseconds)."""
    return {dtype.type: name for name, dtype in _ml_dtypes().items()}
