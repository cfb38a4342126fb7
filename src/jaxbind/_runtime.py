"""Run time: the Python functions the trampoline (cpp/) calls while XLA runs a program.

Everything here runs inside a compiled program, called from C++ with the GIL held:

- `resolve_site`: on the first call of a site, check the call's attributes
  (see _callformat) and return an ``_ext.Site`` holding the callable, its keyword
  arguments and jaxbind's batch loop. The programs that call a site own it (see
  Binding.keep_site); the trampoline holds it weakly, so it goes with them.
- `BufferCheck`: the site's check of the buffers XLA hands over against what
  the binding's abstract function declares for them, once per new set of shapes.
- `format_callback_error`: the text of the error a failing callable becomes.
- `escaped_views`: told when views outlived their call (they then hold copies).
- GPU calls go to `jaxbind._gpu.dispatch`.

`install` hands these to the trampoline, once, at import. Trace-time code
(the registry, the rules, the lowering) never reaches into this module.
"""

from __future__ import annotations

import atexit
import gc
import traceback
import warnings

import jax
import numpy as np

from . import _ext, _gpu
from ._avals import XLA_ELEMENT_TYPES, check_result
from ._binding import lookup
from ._callformat import FORMAT, MAX_LEVELS, NO_LOOP, CallAttributes, Loop
from ._compat import ShapedArray, collect_jax_garbage
from ._errors import words
from ._kernels import Kernel
from ._kwargs import decode_kwargs, encode_kwargs
from ._roles import Body, Role, for_call

__all__ = ["BufferCheck", "format_callback_error", "install", "resolve_site"]


def install() -> None:
    """Hand the trampoline its tables and callbacks (once, at import)."""
    assert _ext.call_format == FORMAT, "the extension and the Python package disagree"
    _ext.init(XLA_ELEMENT_TYPES, resolve_site, format_callback_error, _gpu.dispatch)
    _ext.set_view_hooks(collect_jax_garbage, escaped_views)
    atexit.register(_shutdown)


def _shutdown() -> None:
    """At interpreter exit: programs with effects that were dispatched and not waited for
    run first (JAX waits for them at exit too, but later: atexit runs jaxbind's hook
    before JAX's, which was registered first); then handlers stop calling Python."""
    try:
        jax.effects_barrier()
    except Exception:  # a failed program has reported its own error
        pass
    _ext.shutdown()


def resolve_site(
    fmt: int,
    name: str,
    role_text: str,
    blob: bytes,
    digest: int,
    levels: int,
    flags: bytes,
    n_fixed: int,
    trees: bytes = b"",
):
    """The ``_ext.Site`` for one call site, after checking every attribute of the call.

    `levels`, `flags` and `n_fixed` are the format-2 attributes (-1, b"", -1 in format 1,
    whose loop is inside the keyword arguments); `trees` the format-3 one (b"" before).
    """
    binding = lookup(name)
    if binding is None:
        raise LookupError(
            f"no binding named '{name}' is registered in this process. Import or run the "
            "code that creates it (jaxbind.get_linear_call / get_nonlinear_call, or the "
            "linear_op / multilinear_op / nonlinear_op decorator) before "
            "calling the program"
        )
    call = CallAttributes.read(fmt, name, role_text, blob, digest, levels, flags, n_fixed, trees)
    try:
        role = Role.parse(role_text)
    except LookupError:
        raise LookupError(
            f"jaxbind: binding '{name}' ({binding.kind.value}) has no role {role_text!r}"
        ) from None
    dump = decode_kwargs(blob)
    structure = decode_kwargs(call.trees) if call.trees else None
    if call.format < 3 and _FORMAT2_TREES[0] in dump._values:
        dump, structure = _format2_trees(dump)
    fn = for_call(_callable_body(binding, role), structure)
    if call.format == 1:
        dump, loop = _format1_loop(binding, dump)
    else:
        loop = call.loop
    n_fixed = call.n_fixed
    label = f"'{name}' ({role.describe()})" + (", batched" if loop.levels else "")
    check = BufferCheck(binding, role, dump, loop, n_fixed, structure)
    kernel = None
    if isinstance(fn, Kernel):  # compiled: called without the GIL (see cpp/kernels.h)
        kernel = fn.call_for(dump.to_dict(), f"jaxbind: {label}")
        label = f"'{name}' ({role.describe()})"
    site = _ext.Site(
        fn,
        dump,
        label,
        name,
        loop.levels,
        list(loop.batched),
        binding.options.platform_mode,
        check,
        kernel,
    )
    return binding.keep_site(digest, site)


def _callable_body(binding, role: Role):
    """The callable the trampoline calls for `role`."""
    fn = binding.body(role)
    if binding.role(role).kind is Body.JAX:
        raise LookupError(
            f"jaxbind: {role.describe()} of '{binding.name}' is a JAX function, "
            "which programs contain inlined; no call of it goes through the trampoline"
        )
    return fn


_FORMAT2_TREES = ("jaxbind_in", "jaxbind_out")


def _format2_trees(dump):
    """Formats 1 and 2 kept a JAX-native op's pytree structure in the keyword arguments."""
    values = dump.to_dict()
    trees = {"in": values.pop(_FORMAT2_TREES[0]), "out": values.pop(_FORMAT2_TREES[1], None)}
    return encode_kwargs(values), encode_kwargs(trees)


def _format1_loop(binding, dump):
    """Format 1 kept jaxbind's loop in the keyword arguments, as "batch_axes"."""
    if binding.options.vectorized or "batch_axes" not in dump._values:
        return dump, NO_LOOP
    values = dump.to_dict()
    batch_axes = values.pop("batch_axes")  # all leading (see _rules.batching._batch_looped)
    if not isinstance(batch_axes, tuple) or not all(
        isinstance(ax, tuple) and all(type(a) is int for a in ax) for ax in batch_axes
    ):
        raise ValueError("the call's batch axes are not a tuple of tuples of integers")
    levels = max((len(ax) for ax in batch_axes), default=0)
    if not 0 < levels <= MAX_LEVELS:
        raise ValueError(f"the call's batch levels ({levels}) are out of range")
    return encode_kwargs(values), Loop(levels, tuple(bool(ax) for ax in batch_axes))


# 32-bit forms: with jax_enable_x64 off when the program was traced, a declared
# 64-bit dtype became its 32-bit form in the program.
_NARROW = {
    np.dtype(a): np.dtype(b)
    for a, b in (
        (np.int64, np.int32),
        (np.uint64, np.uint32),
        (np.float64, np.float32),
        (np.complex128, np.complex64),
    )
}


class BufferCheck:
    """Checks one site's buffers against the binding's abstract function.

    Called by the trampoline with ``(inputs, outputs)``, each a tuple of
    ``(shape, XLA element type)``, for every set of buffer shapes it has not seen at
    this site. Returns None if the program's outputs are what the abstract function
    declares for its inputs, else a message saying what differs. The abstract
    function sees the inputs without jaxbind's batch axes, as at trace time.
    """

    def __init__(self, binding, role: Role, dump, loop: Loop, n_fixed: int | None, trees=None):
        self.binding, self.role, self.dump, self.loop = binding, role, dump, loop
        self.n_fixed, self.trees = n_fixed, trees

    def __call__(self, ins, outs) -> str | None:
        try:
            return self._problem(ins, outs)
        except Exception as exc:  # the abstract function itself failed
            return (
                f"{words(self.binding.options).shapes} fails for the buffers of this call "
                f"({_describe(ins)}): {type(exc).__name__}: {exc}"
            )

    def _avals(self, buffers, what, batched):
        avals = []
        for i, (shape, code) in enumerate(buffers):
            dtype = XLA_ELEMENT_TYPES.get(code)
            if dtype is None:
                raise TypeError(
                    f"{what} {i} has XLA element type {code}, which jaxbind "
                    "cannot pass to Python callables"
                )
            if self.loop.levels and (batched is None or batched[i]):
                shape = shape[self.loop.levels :]
            avals.append(ShapedArray(tuple(shape), dtype))
        return avals

    def _problem(self, ins, outs):
        binding, entry = self.binding, self.binding.role(self.role)
        if entry.abstract is None:  # shapes came from the primals at trace time
            return None
        in_avals = self._avals(ins, "input", self.loop.batched)
        out_avals = self._avals(outs, "output", None)
        kwargs = self.dump.to_dict()
        n = self.n_fixed
        if n is None:  # format 1 (the JVP's): primals, then tangents of the non-fixed ones
            n = (len(in_avals) + binding.options.fixed) // 2
        if binding.options.vectorized:
            kwargs.setdefault("batch_axes", None)
        declared = check_result(
            entry.declared(in_avals, kwargs, n, self.trees),
            words(binding.options).shapes,
            kwargs.get("batch_axes") is not None,
        )
        if len(declared) != len(out_avals):
            return (
                f"the program gives it {len(out_avals)} outputs, but "
                f"{words(binding.options).shapes} "
                f"declares {len(declared)} for inputs ({_describe(ins)})"
            )
        # XLA may run this check on a thread where jax_enable_x64 (thread-local under
        # `jax.enable_x64`) is off although the program was traced with it on: then the
        # declared dtypes were canonicalized to 32 bits here, and 64 bits are right too.
        narrowed = jax.dtypes.canonicalize_dtype(np.float64) != np.dtype(np.float64)
        for k, ((shape, dtype, _), got) in enumerate(zip(declared, out_avals)):
            dtype = np.dtype(dtype)
            allowed = {dtype, _NARROW.get(dtype, dtype)}
            if narrowed:
                allowed |= {wide for wide, narrow in _NARROW.items() if narrow == dtype}
            if tuple(shape) != got.shape or got.dtype not in allowed:
                return (
                    f"output {k} is {got.dtype.name}{list(got.shape)} in the program, but "
                    f"{words(binding.options).shapes} declares {dtype.name}{list(shape)} for "
                    "inputs "
                    f"({_describe(ins)})"
                )
        return None


def _describe(buffers) -> str:
    return ", ".join(
        f"{XLA_ELEMENT_TYPES[c].name if c in XLA_ELEMENT_TYPES else c}{list(s)}" for s, c in buffers
    )


def escaped_views(label, moved, outs, ins) -> None:
    """Views of a call outlived it and now hold their own copies (see cpp/views.h).

    `moved` lists ``(address, nbytes, view, holders)``: the XLA memory each view
    pointed at, and how many references other than its tuple's it had. What holds a
    view itself is fine now. What took the memory from it during the call is not:

    - arrays derived from a view (slices, reshapes, ``.T``, ``.real``) point into
      XLA's memory too. Those the garbage collector can reach are moved into the view's
      copy, read-only;
    - a memoryview of a view is released (using it raises, rather than reading
      reused memory);
    - JAX arrays made from a view (``jax.device_put`` / ``jnp.asarray`` alias NumPy
      memory on the CPU), and holders outside Python, cannot be moved: they are named
      in a warning.

    Costs nothing unless a callable kept something: then one pass over the garbage
    collector's referrers, and a pass over its objects if a view has holders that the
    first cannot explain.
    """
    views = [entry[2] for entry in moved]
    ours = {id(outs), id(ins), id(moved), id(views)} | {id(entry) for entry in moved}
    # Output memory is XLA's alone during the call: a JAX array sharing it was made in
    # the callable. (Input memory may be the caller's own array: see below.)
    outputs = [e for e in moved if any(e[2] is v for v in outs)]
    for start, nbytes, _, _ in outputs:
        text = _aliased(label, start, nbytes)
        if text is not None:
            warnings.warn(text, RuntimeWarning, stacklevel=2)
            return
    held = {id(v): 0 for v in views}
    mine = {id(v) for v in views}
    for referrer in gc.get_referrers(*views):
        # a memoryview's buffer holds the view's memory, not just the view; a tuple of
        # nothing but views may be the call's own (some Pythons copy it): when unsure,
        # count no holder, which costs a scan, never a missed array
        if (
            id(referrer) in ours
            or type(referrer).__name__ == "managedbuffer"
            or (type(referrer) is tuple and all(id(x) in mine for x in referrer))
        ):
            continue
        for item in gc.get_referents(referrer):
            if id(item) in held:
                held[id(item)] += 1
    unexplained = {id(e[2]): e for e in moved if e[3] > held[id(e[2])]}
    if not unexplained:
        return
    derived = _move_derived(unexplained, ours)
    for key, (start, nbytes, _view, holders) in unexplained.items():
        if holders <= held[key] + derived.get(key, 0):
            continue
        warnings.warn(_held_elsewhere(label, start, nbytes), RuntimeWarning, stacklevel=2)
        return


def _move_derived(escaped, ours) -> dict:
    """Move arrays derived from the escaped views into their copies. Counts, per view,
    the derived arrays and memoryviews, and the objects that hold the view itself."""
    found, seen = {}, set()
    for obj in gc.get_objects():
        if id(obj) in ours:
            continue
        for item in gc.get_referents(obj):
            if id(item) in escaped:  # the view itself (a tuple the first pass skipped)
                found[id(item)] = found.get(id(item), 0) + 1
                continue
            if id(item) in seen:
                continue
            # by type(), which never dereferences: a dead weakref.proxy among the referents
            # raises ReferenceError on isinstance()
            kind = type(item)
            if issubclass(kind, np.ndarray):
                base = item.base
                entry = escaped.get(id(base)) if base is not None else None
                if entry is None or item is entry[2]:
                    continue
                seen.add(id(item))
                start, nbytes, view, _ = entry
                if _ext.move_view(item, start, nbytes, view.ctypes.data):
                    found[id(base)] = found.get(id(base), 0) + 1
            elif kind is memoryview and id(_exporter(item)) in escaped:
                seen.add(id(item))
                found[id(item.obj)] = found.get(id(item.obj), 0) + 1
                try:
                    item.release()
                except (BufferError, ValueError):
                    pass
    return found


def _exporter(view: memoryview):
    try:
        return view.obj
    except ValueError:  # released already
        return None


def _held_elsewhere(label, start, nbytes) -> str:
    text = _aliased(label, start, nbytes)
    if text is not None:
        return text
    return (
        f"jaxbind: the callable of {label} let something outside Python (a C "
        "extension, a raw pointer) keep the memory of one of its input or output arrays. "
        "That memory is XLA's and is reused after the call; copy what you need to keep "
        "(np.array(view))"
    )


def _aliased(label, start, nbytes) -> str | None:
    """The warning for a live JAX array that shares [start, start + nbytes), if any."""
    try:
        arrays = jax.live_arrays("cpu")
    except Exception:  # no CPU backend
        arrays = []
    for array in arrays:
        try:
            address = array.unsafe_buffer_pointer()
        except Exception:  # deleted, or not on one device
            continue
        if start <= address < start + max(nbytes, 1):
            return (
                f"jaxbind: the callable of {label} made a JAX array ({array.dtype}"
                f"{list(array.shape)}) that shares memory with one of its input or output "
                "arrays (jax.device_put or jnp.asarray of a view does not copy on the "
                "CPU). That memory is XLA's and is reused after the call, so the JAX "
                "array will read other data. Copy instead: jnp.array(view, copy=True), "
                "or np.array(view) first"
            )
    return None


def format_callback_error(label, etype, value, tb) -> str:
    """Text of the error XLA raises when a callable fails."""
    name = getattr(etype, "__name__", str(etype))
    lines = traceback.format_exception(etype, value, tb)
    text = f"{value}"
    if isinstance(value, RecursionError) and text.startswith("Recursively calling jit"):
        text = text.split("\n", 1)[0] + "\n" + _REENTERED_JIT
    return (
        f"jaxbind: {label} raised {name}: {text}\n"
        "Traceback of the callable (most recent call last):\n" + "".join(lines[1:])
    )


_REENTERED_JIT = (
    "The callable called a jitted function whose first call with these argument types is "
    "the one now running the callable. JAX refuses that on the same thread (and waits "
    "forever on another one, as it does for jax.pure_callback): the program is not ready "
    "until that first call returns. Call the jitted function once before (outside the "
    "callable), or call the jaxbind op itself eagerly, which jaxbind allows to recurse."
)
