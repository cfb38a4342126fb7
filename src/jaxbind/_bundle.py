"""Bundles: a jaxbind program for a PJRT host without Python (docs/without-python.md).

`bundle` lowers a function for the CPU as `jaxbind.export` does, with every op whose body
a host without Python cannot run (a Python callable, a numba kernel, a Python state)
computed by its JAX reference, or refused naming the op (jaxbind._where.runs, the
"bundle" switch), and writes a directory:

- ``program.mlirbc``: the program, a StableHLO portable artifact (PJRT format "mlir"),
  serialized at the oldest StableHLO version that expresses it (for older plugins);
- ``compile_options.pb``: the CompileOptionsProto to compile it with (one replica, one
  partition: a PJRT plugin aborts on an empty one);
- ``lib/``: a copy of every shared library that holds a C kernel or a C state's function
  (a bundle needs no environment variable to find them: paths are relative to it);
- ``manifest.json``: the program's inputs and outputs (PJRT element types, shapes) and
  every jaxbind call in it, by its site digest: the op's label, the C kernel (library,
  symbol, ABI version, threads, whole batches), its static keyword arguments in the ABI's
  form, jaxbind's batch loop, the buffers the program gives it, and the op's C state
  (setup and teardown, concurrency, setup arguments).

jaxbind's C runtime (cpp/runtime/, `runtime_library`) reads it. Trace time only.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.export
import numpy as np

from . import _compat, _ext
from ._binding import lookup
from ._callformat import CallAttributes
from ._errors import about
from ._export import export_safety_checks
from ._kernels import abi
from ._kwargs import decode_kwargs
from ._references import bundling, use_reference
from ._roles import Body, Role
from ._rules.targets import TARGETS

__all__ = ["BUNDLE_FORMAT", "bundle", "runtime_library"]

BUNDLE_FORMAT = 1  # jaxbind/runtime.h's JAXBIND_RUNTIME_VERSION: what the runtime reads

# PJRT_Buffer_Type of pjrt_c_api.h, by NumPy dtype
_PJRT_TYPES = {
    "bool": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6, "uint16": 7,
    "uint32": 8, "uint64": 9, "float16": 10, "float32": 11, "float64": 12, "bfloat16": 13,
    "complex64": 14, "complex128": 15,
}  # fmt: skip
# MLIR's element types, by name, as NumPy dtypes
_MLIR_TYPES = {
    "i1": "bool", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "ui8": "uint8", "ui16": "uint16", "ui32": "uint32", "ui64": "uint64", "f16": "float16",
    "bf16": "bfloat16", "f32": "float32", "f64": "float64", "complex<f32>": "complex64",
    "complex<f64>": "complex128",
}  # fmt: skip
_CPU_TARGETS = frozenset(t.name for t in TARGETS if t.custom_call and t.platform == "cpu")


def runtime_library() -> str:
    """The path of jaxbind's C runtime, ``libjaxbind_runtime.so`` (its header,
    ``jaxbind/runtime.h``, is in `jaxbind.kernel_include_dir`): a PJRT host links it, or
    loads it, to run bundles (`jaxbind.bundle`) without Python."""
    # beside the extension, which an editable install keeps outside the source tree
    path = pathlib.Path(_ext.__file__).parent / "lib" / "libjaxbind_runtime.so"
    if not path.exists():
        raise FileNotFoundError(
            f"jaxbind: the C runtime is not installed ({path} is missing); reinstall jaxbind "
            "from its wheel, or build it (pip install .)"
        )
    return str(path)


def bundle(
    fun: Callable[..., Any],
    *args: Any,
    path: str | os.PathLike,
    portable: bool = False,
    **kwargs: Any,
) -> str:
    """Write a bundle: `fun` at `args` lowered for the CPU, for a PJRT host without Python.

    Ops whose bodies are C kernels (`jaxbind.kernel` of a function in a shared library,
    with no state or a `jaxbind.c_state`) stay native: jaxbind's C runtime runs them in the
    host. Every other op is lowered to its JAX reference (``reference=``); an op without one
    is refused, naming it. The program's jnp operations are XLA's, as in `jaxbind.export`.

    Args:
      fun: the function (jitted or not); its arguments and results may be pytrees, which
        the bundle flattens (the host passes and gets flat arrays, in order).
      args, kwargs: example arguments (arrays or `jax.ShapeDtypeStruct`s), with static
        shapes.
      path: the directory to write (made if missing; files of an earlier bundle there are
        replaced).
      portable: lower every op to its reference instead, as ``jaxbind.export(...,
        portable=True)`` does: a program without jaxbind calls (the runtime then registers
        nothing but its targets).

    Returns:
      The bundle's directory. See docs/without-python.md for the host's side.
    """
    if not isinstance(portable, bool):
        raise TypeError(f"jaxbind.bundle: portable must be a bool, got {portable!r}")
    if not hasattr(fun, "lower"):
        fun = jax.jit(fun)
    with use_reference(strict=True) if portable else bundling():
        exported = jax.export.export(
            fun, platforms=("cpu",), disabled_checks=export_safety_checks()
        )(*args, **kwargs)
    where = f"jaxbind.bundle({getattr(fun, '__name__', 'fun')})"
    avals = [exported.in_avals[i] for i in sorted(exported.module_kept_var_idx)]
    if any(not all(isinstance(d, int) for d in a.shape) for a in (*avals, *exported.out_avals)):
        raise TypeError(f"{where}: a bundle's program takes and gives arrays of static shapes")
    if exported.ordered_effects or exported.unordered_effects:
        raise TypeError(f"{where}: a bundle's program can have no effects")
    out = pathlib.Path(path)
    out.mkdir(parents=True, exist_ok=True)
    libraries = _Libraries(out / "lib")
    calls = [_call_entry(found, types, libraries) for found, types in _custom_calls(exported)]
    (out / "program.mlirbc").write_bytes(
        _compat.oldest_portable_artifact(exported.mlir_module_serialized)
    )
    (out / "compile_options.pb").write_bytes(_compat.compile_options_proto(1, 1))
    manifest = {
        "jaxbind_bundle": BUNDLE_FORMAT,
        "platform": "cpu",
        "jax": jax.__version__,
        "program": "program.mlirbc",
        "compile_options": "compile_options.pb",
        "inputs": [_io(a, i) for a, i in zip(avals, sorted(exported.module_kept_var_idx))],
        "outputs": [_io(a, i) for i, a in enumerate(exported.out_avals)],
        "calls": calls,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return str(out)


def _io(aval: Any, index: int) -> dict:
    dtype = np.dtype(aval.dtype)
    return {
        "argument": index,
        "dtype": dtype.name,
        "pjrt_type": _PJRT_TYPES[dtype.name],
        "shape": [int(d) for d in aval.shape],
        "bytes": int(np.prod(aval.shape, dtype=np.int64)) * dtype.itemsize,
    }


def _custom_calls(exported: jax.export.Exported) -> Iterator[tuple[dict, dict]]:
    """jaxbind's custom calls in the program: their attributes (as the trampoline reads
    them) and their operands' and results' types."""
    module, context = _compat.parsed_module(exported.mlir_module())
    with context:
        for op in _operations(module.operation):
            if op.name != "stablehlo.custom_call":
                continue
            target = _compat.ir.StringAttr(op.attributes["call_target_name"]).value
            if not target.startswith("jaxbind"):
                continue
            if target not in _CPU_TARGETS:
                raise TypeError(
                    f"jaxbind.bundle: the program calls {target}, which is not a CPU target"
                )
            config = _compat.ir.DictAttr(op.attributes["mhlo.backend_config"])
            found = {config[i].name: _value(config[i].attr) for i in range(len(config))}
            types = {
                "inputs": [_buffer(v.type) for v in op.operands],
                "outputs": [_buffer(r.type) for r in op.results],
            }
            yield found, types


def _operations(op: Any) -> Iterator[Any]:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _operations(inner.operation)


def _value(attr: Any) -> Any:
    """An FFI attribute's value: a str, an int, or a uint8 array's bytes. (MLIR's Python
    bindings give the attribute's own class, or a plain Attribute that casts to it.)"""
    ir = _compat.ir
    for kind, value in (
        (ir.StringAttr, lambda a: a.value),
        (ir.IntegerAttr, lambda a: a.value),
        (ir.DenseIntElementsAttr, lambda a: bytes(int(v) & 0xFF for v in a)),
    ):
        try:
            return value(kind(attr))
        except (ValueError, TypeError):
            continue
    raise TypeError(f"jaxbind.bundle: an attribute of a jaxbind call is {attr}")


def _buffer(mlir_type: Any) -> dict:
    t = _compat.ir.RankedTensorType(mlir_type)
    name = _MLIR_TYPES.get(str(t.element_type))
    if name is None:
        raise TypeError(
            f"jaxbind.bundle: a jaxbind call takes or gives {t}, a type a kernel takes not"
        )
    return {"dtype": abi.xla_code(_dtype(name)), "shape": [int(d) for d in t.shape]}


def _dtype(name: str) -> np.dtype:
    return np.dtype(jax.numpy.bfloat16) if name == "bfloat16" else np.dtype(name)


def _call_entry(found: dict, types: dict, libraries: _Libraries) -> dict:
    """The manifest's entry for one call: what the C runtime runs it with."""
    call = CallAttributes.read(found)
    binding = lookup(call.binding)
    if binding is None:
        raise LookupError(
            f"jaxbind.bundle: the program calls '{call.binding}', which is not registered"
        )
    role = Role.parse(call.role)
    label = f"'{call.binding}' ({role.describe()})"
    body: Any = binding.body(role)  # a Kernel where Body.of says so
    function = body.library_function() if Body.of(body) is Body.KERNEL else None
    if function is None:  # (else the switch took its reference)
        raise TypeError(
            f"{about(call.binding, call.role)}: its body is no C kernel in a shared library"
        )
    values = decode_kwargs(call.kwargs).to_dict()
    where = f"jaxbind: {label}"
    entry: dict[str, Any] = {
        "site": str(call.digest),
        "binding": call.binding,
        "role": call.role,
        "label": label,
        "kernel": {
            "library": libraries.add(function[0]),
            "symbol": function[1],
            "name": body.name,
            "abi_version": body.abi_version,
            "threads": body.threads or 0,
            "batches": body.batches,
        },
        "kwargs": [
            _kwarg(t) for t in (abi.typed_kwarg(k, values[k], where) for k in sorted(values))
        ],
        "loop": {"levels": call.loop.levels, "batched": [int(b) for b in call.loop.batched]},
        "buffers": types,
        "state": None,
    }
    sdef = binding.options.state
    if sdef is not None:
        native = sdef.native  # (a C state: the bundle switch refused any other)
        arguments = sdef.arguments(values, label)
        typed = [_kwarg(abi.typed_kwarg(k, arguments[k], where)) for k in sorted(arguments)]
        setup = {"library": libraries.add(native.setup_symbol[0]), "symbol": native.setup_symbol[1]}
        teardown = None
        if native.teardown_symbol is not None:
            teardown = {
                "library": libraries.add(native.teardown_symbol[0]),
                "symbol": native.teardown_symbol[1],
            }
        share = hashlib.blake2b(
            json.dumps([setup, teardown, sdef.concurrency, sdef.pool_size, typed]).encode(),
            digest_size=16,
        ).hexdigest()
        entry["state"] = {
            "name": sdef.name,
            "setup": setup,
            "teardown": teardown,
            "concurrency": sdef.concurrency,
            "pool_size": sdef.pool_size,
            "arguments": typed,
            "share": share,
        }
    return entry


def _kwarg(typed: abi.TypedKwarg) -> dict:
    name, kind, int_value, float_value, string, array = typed
    return {
        "name": name,
        "type": kind,
        "int": int_value,
        "float": float(float_value).hex(),
        "string": None if string is None else string.decode(),
        "array": None
        if array is None
        else {"dtype": array[0], "shape": list(array[1]), "hex": array[2].hex()},
    }


class _Libraries:
    """The shared libraries a bundle copies into its lib/, each once; names relative to
    the bundle."""

    def __init__(self, folder: pathlib.Path):
        self.folder = folder
        self.copied: dict[str, str] = {}

    def add(self, path: str) -> str:
        if path not in self.copied:
            self.folder.mkdir(parents=True, exist_ok=True)
            name, taken = pathlib.Path(path).name, set(self.copied.values())
            stem, k = name, 1
            while f"lib/{name}" in taken:
                name, k = f"{k}_{stem}", k + 1
            shutil.copy2(path, self.folder / name)
            self.copied[path] = f"lib/{name}"
        return self.copied[path]
