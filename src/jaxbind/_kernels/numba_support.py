"""What jaxbind adds to numba for its kernels (made once, on the first numba kernel):

- intrinsics: an address (int64) as a pointer and back; an array retyped read-only; a
  call of the ABI's parallel_for through its address; words on the stack;
- `failed` and `failed_count`, which write a message into the call's error channel
  (``call->error``), so that a generated wrapper can say what failed;
- typing rules that keep a kernel's inputs read-only. A kernel's inputs are XLA's
  buffers (JAX arrays are immutable), typed as numba's read-only arrays, so numba
  refuses most writes into them when it compiles the kernel. The rules here close the
  routes that numba itself lets through (numba 0.60 - 0.68): ``a.flat[i] = v`` (its
  generic rule for sequences), ``np.nditer`` (whose elements are typed writable), the
  in-place operators (``a += 1``, an internal error), ``np.dot(a, b, out)`` into a
  read-only ``out`` (lowered straight to BLAS), and ``np.ascontiguousarray`` /
  ``np.asfortranarray``, which return their argument itself, typed writable, when it
  already has the layout asked for. They concern read-only arrays only.

Each rule is registered for the CPU target, so numba tries it before its own generic
ones.
"""

from __future__ import annotations

import numpy as np

from .abi import CALL

__all__ = ["READONLY_MARK", "ReadOnlyWrite", "message", "support"]

READONLY_MARK = "a write into a read-only array"

_support: dict = {}


class ReadOnlyWrite(TypeError):
    """Raised while numba types a write into a read-only array that numba itself lets
    through (not a numba error, so that numba does not try another typing rule)."""


def support() -> dict:
    """numba, and jaxbind's additions to it (see the module's docstring), by name:
    numba, pointer, address, parallel_for, readonly, writable, failed, failed_count,
    stack_words."""
    if not _support:
        _support.update(_intrinsics())
        _read_only_rules(_support["readonly"])
    return _support


def message(text: str) -> np.ndarray:
    """A message for `failed`: its bytes (ASCII), as numba takes a constant."""
    return np.frombuffer(text.encode("ascii", "replace"), np.uint8).copy()


def _intrinsics() -> dict:
    import numba
    from numba.core import cgutils, types
    from numba.core.imputils import impl_ret_borrowed
    from numba.extending import intrinsic

    @intrinsic
    def pointer(typingctx, address):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], cgutils.voidptr_t)

        return types.voidptr(types.int64), codegen

    @intrinsic
    def address(typingctx, ptr):
        def codegen(context, builder, signature, args):
            return builder.ptrtoint(args[0], cgutils.intp_t)

        return types.int64(types.voidptr), codegen

    @intrinsic
    def parallel_for(typingctx, fn, call, n_tasks, task, context):
        # int32_t (*)(const jaxbind_call *, int64_t, jaxbind_task_fn, void *), all
        # given as int64 addresses
        def codegen(ctx, builder, signature, args):
            from llvmlite import ir

            i64, ptr = ir.IntType(64), cgutils.voidptr_t
            fnty = ir.FunctionType(ir.IntType(32), [ptr, i64, ptr, ptr])
            target = builder.inttoptr(args[0], fnty.as_pointer())
            return builder.call(
                target,
                [
                    builder.inttoptr(args[1], ptr),
                    args[2],
                    builder.inttoptr(args[3], ptr),
                    builder.inttoptr(args[4], ptr),
                ],
            )

        i64 = types.int64
        return types.int32(i64, i64, i64, i64, i64), codegen

    @intrinsic
    def stack_words(typingctx, n):
        # a pointer to n int64 words on the calling function's stack (n: a constant)
        if not isinstance(n, types.IntegerLiteral):
            return None
        words = n.literal_value

        def codegen(context, builder, signature, args):
            from llvmlite import ir

            space = cgutils.alloca_once(builder, ir.IntType(64), size=words)
            return builder.bitcast(space, cgutils.voidptr_t)

        return types.voidptr(n), codegen

    def retyped(mutable: bool):
        def typer(typingctx, array):
            if not isinstance(array, types.Array):
                return None

            def codegen(context, builder, signature, args):  # the same array, retyped
                return impl_ret_borrowed(context, builder, signature.return_type, args[0])

            return array.copy(readonly=not mutable)(array), codegen

        return intrinsic(typer)

    readonly = retyped(mutable=False)
    # (only for numba's own functions, whose results the rules below make read-only again)
    writable = retyped(mutable=True)

    words, error, error_size = CALL.words, CALL["error"], CALL["error_size"]

    # (messages are bytes, not str: numba's str support would add seconds to the
    # compilation of every kernel)
    @numba.njit
    def channel(call):
        """The call's error channel as a uint8 array (empty: none)."""
        c = numba.carray(call, (words,), np.int64)
        size = c[error_size] if c[error] != 0 else 0
        return numba.carray(pointer(c[error]), (max(size, 0),), np.uint8)

    @numba.njit
    def put(out, k, text):
        """Write the bytes `text` at `out[k]`, leaving room for the NUL; the next k."""
        for b in text:
            if k < out.size - 1:
                out[k] = b
                k += 1
        return k

    @numba.njit
    def failed(call, text):
        """Write `text` (see `message`) into the call's error channel, cut to fit; return
        -1, the status of a failed call."""
        out = channel(call)
        if out.size:
            out[put(out, 0, text)] = 0
        return np.int32(-1)

    @numba.njit
    def failed_count(call, text, count, rest):
        """`failed` with the message `text`, `count` in decimal, then `rest`."""
        out = channel(call)
        if out.size:
            digits = np.zeros(20, np.uint8)
            n, m = abs(np.int64(count)), 0
            while m == 0 or n > 0:
                digits[19 - m] = 48 + n % 10
                n //= 10
                m += 1
            k = put(out, 0, text)
            if count < 0 and k < out.size - 1:
                out[k] = 45  # '-'
                k += 1
            k = put(out, k, digits[20 - m :])
            out[put(out, k, rest)] = 0
        return np.int32(-1)

    return dict(
        numba=numba,
        pointer=pointer,
        address=address,
        parallel_for=parallel_for,
        readonly=readonly,
        writable=writable,
        failed=failed,
        failed_count=failed_count,
        stack_words=stack_words,
    )


def _read_only_rules(readonly) -> None:
    import operator

    from numba.core import types
    from numba.core.typing.templates import AbstractTemplate, infer_global
    from numba.extending import overload

    writable = _support["writable"]

    def refuse(array, how):
        raise ReadOnlyWrite(
            f"{READONLY_MARK}: {how} {array}, a jaxbind kernel's input (or array "
            "keyword argument), which is read-only"
        )

    def first_rule(op, check):
        class Rule(AbstractTemplate):
            metadata = {"target": "cpu"}

            def generic(self, args, kws):
                check(args, kws)
                return None

        infer_global(op)(Rule)

    def is_read_only(t) -> bool:
        return isinstance(t, types.Array) and not t.mutable

    def flat_write(args, kws):
        if args and isinstance(args[0], types.NumpyFlatType):
            if not args[0].array_type.mutable:
                refuse(args[0].array_type, "a.flat[...] = ... writes into")

    def nditer(args, kws):
        arrays = args[0] if args and isinstance(args[0], types.BaseTuple) else args
        for array in arrays or ():
            if is_read_only(array):
                refuse(array, "np.nditer yields writable elements of")

    def in_place(args, kws):
        if args and is_read_only(args[0]):
            refuse(args[0], "an in-place operator writes into")

    def dot_out(args, kws):
        out = args[2] if len(args) > 2 else kws.get("out")
        if is_read_only(out):
            refuse(out, "np.dot(a, b, out) writes into")

    first_rule(operator.setitem, flat_write)
    first_rule(np.nditer, nditer)
    first_rule(np.dot, dot_out)
    for name in (
        "iadd isub imul itruediv ifloordiv imod ipow imatmul iand ior ixor ilshift irshift"
    ).split():
        first_rule(getattr(operator, name), in_place)

    # np.ascontiguousarray / np.asfortranarray of a read-only array: numba's result,
    # typed read-only (it is the argument itself where numba does not copy)
    @overload(np.ascontiguousarray, target="cpu")
    def _ascontiguousarray(a):
        if is_read_only(a):
            return lambda a: readonly(np.ascontiguousarray(writable(a)))
        return None

    @overload(np.asfortranarray, target="cpu")
    def _asfortranarray(a):
        if is_read_only(a):
            return lambda a: readonly(np.asfortranarray(writable(a)))
        return None
