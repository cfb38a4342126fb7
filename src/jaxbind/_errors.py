"""Error messages: every one names the binding, says what to do, and says it in the words
of the API the op was made with.

`words(options)` is that API's vocabulary: the pytree API's decorators, ``def_*``
methods and option names (``fixed=``, ``vectorized=``, "the shape function"), or
``get_linear_call`` / ``get_nonlinear_call`` with JAXbind's option names
(``first_n_args_fixed``, ``func_can_batch``, "the abstract function"). Every message
that names an option, a way to give a body or the function that declares shapes takes
the words from here, never writes them itself.

(The text of errors raised inside a running program is made by _runtime.)
"""

from __future__ import annotations

import inspect
import linecache
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._roles import Role, describe_role

__all__ = [
    "ExportedDefaultNameWarning",
    "Words",
    "about",
    "add_context",
    "callback_hint",
    "refused_arguments",
    "words",
]


def about(name: str, role: str | None = None) -> str:
    """How every message about one binding starts: ``jaxbind: 'name'``, with the role when
    one is meant (``jaxbind: 'mymod.fft' (the transpose)``)."""
    if role is None:
        return f"jaxbind: '{name}'"
    return f"jaxbind: '{name}' ({describe_role(role)})"


def add_context(exc: BaseException, text: str) -> BaseException:
    """Attach a note naming the binding to an exception raised by user code."""
    exc.add_note(text)
    return exc


def refused_arguments(
    fn: Callable[..., Any], args: tuple[Any, ...] | None, kwargs: dict[str, Any], spelled: str = ""
) -> tuple[str, str, bool] | None:
    """``(what, fix, keywords)`` where the parameters of `fn` refuse the call
    ``fn(*args, **kwargs)``: what they refuse ("does not take the keyword argument 'n' that
    the call passes (its parameters: (x))"), the line to write instead, and whether the
    keyword arguments are what they refuse (else the positional ones). None if they take the call (a
    TypeError it raised then came from the function's code), or if `fn` has no signature
    to read. `args` None: the keyword arguments alone.

    `spelled` is how the user gave `fn` where it is a lambda (``"shape="`` for
    ``shape=lambda x: ...``), so that the fix reads as the line they wrote.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins)
        return None
    try:
        if args is None:
            signature.bind_partial(**kwargs)
        else:
            signature.bind(*args, **kwargs)
    except TypeError as exc:
        reason = str(exc)
    else:
        return None
    params = list(signature.parameters.values())
    kinds = {p.kind for p in params}
    any_keyword = inspect.Parameter.VAR_KEYWORD in kinds
    any_positional = inspect.Parameter.VAR_POSITIONAL in kinds
    plain = [p.replace(annotation=p.empty) for p in params]
    text = str(signature.replace(parameters=plain, return_annotation=signature.empty))[1:-1]
    has = f"(its parameters: ({text}))"

    def line(extra: str) -> str:
        inner = ", ".join(x for x in (text, extra) if x)
        if getattr(fn, "__name__", "") == "<lambda>":
            return f"{spelled}lambda {inner}: ..."
        return f"def {getattr(fn, '__name__', 'fn')}({inner}): ..."

    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unexpected = [k for k in kwargs if not any_keyword and k not in named]
    if unexpected:
        s = "s" if len(unexpected) > 1 else ""
        listed = ", ".join(repr(k) for k in unexpected)
        return (
            f"does not take the keyword argument{s} {listed} that the call passes {has}",
            f"write {line('**kwargs')} (or take {listed} as a parameter{s})",
            True,
        )
    if args is None:
        return None
    missing = [
        p.name
        for p in params
        if p.kind is p.KEYWORD_ONLY and p.default is p.empty and p.name not in kwargs
    ]
    if missing:
        listed = ", ".join(f"{k}=..." for k in missing)
        return (
            f"requires the keyword argument{'s' * (len(missing) > 1)} {listed}, which the "
            f"call does not pass {has}",
            f"pass {listed} in the call, or give the parameter a default",
            True,
        )
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty and p.name not in kwargs]
    if len(args) > len(positional) and not any_positional:
        n = len(positional)
        return (
            f"takes {n} positional argument{'s' * (n != 1)} {has}, but the call passes "
            f"{len(args)} arguments",
            f"if the call's {len(args)} are right, give it {len(args)} positional parameters "
            "(or *args)",
            False,
        )
    if len(args) < len(required):
        n = len(required)
        return (
            f"takes {n} positional argument{'s' * (n != 1)} {has}, but the call passes "
            f"{len(args)} arguments",
            f"if the call's {len(args)} are right, give it {len(args)} positional parameters",
            False,
        )
    return f"refuses the call's arguments: {reason} {has}", "make its parameters take them", False


def callback_hint(value: BaseException) -> str:
    """A line on the usual cause of an error a callable raised, where one is known ("" if
    none): what the user wrote, and what to write instead.

    Known: ``out[0] = ...`` in a callable whose first parameter (JAXbind's protocol), or
    whose ``out=`` parameter (the pytree API's), is the tuple of its output arrays: the
    line that raised assigns an item of that parameter.
    """
    if not (
        isinstance(value, TypeError)
        and str(value) == "'tuple' object does not support item assignment"
        and value.__traceback__ is not None
    ):
        return ""
    tb = value.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    line = linecache.getline(code.co_filename, tb.tb_lineno)
    wrote = re.match(r"\s*(\w+)\s*\[([^\]]*)\]\s*=(?!=)", line)
    params = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    if wrote is None or wrote[1] not in params or wrote[1] not in (params[0], "out"):
        return ""
    name, index = wrote.groups()
    return (
        f"{name}[{index}] = ... replaces an item of the tuple {name}, which holds the output "
        f"arrays; write into the array in place instead: {name}[{index}][...] = ..."
    )


@dataclass(frozen=True, slots=True)
class Words:
    """The words of one API.

    Attributes:
      pytree_api: the pytree API (decorators), else JAXbind's ``get_*_call``.
      fixed: the option that counts the fixed leading arguments.
      vectorized: the option by which the callables batch themselves.
      shapes: what declares the output shapes ("the shape function").
      callable_contract: how a callable hands back its results.
    """

    pytree_api: bool
    fixed: str
    vectorized: str
    shapes: str
    callable_contract: str

    def shapes_of(self, name: str, role: str = "f") -> str:
        """ "the shape function of 'name'", with the role where it is not the function."""
        if role == "f":
            return f"{self.shapes} of '{name}'"
        return f"{self.shapes} of '{name}' ({describe_role(role)})"

    def give(self, role: str | Role) -> str:
        """How the user gives an op the body of `role` ("define it with ...")."""
        role = Role.parse(role) if isinstance(role, str) else role
        if self.pytree_api:
            if role.base == "T":
                argnum = "" if role.index is None else f"(argnum={role.index})"
                return (
                    f"define it with the op's @op.def_transpose{argnum} decorator, or give "
                    f"the op a JAX reference ({self.give_reference()}) to derive it from"
                )
            return (
                f"define it with the op's @op.def_{role.base} decorator, or give the op a JAX "
                f"reference ({self.give_reference()}) to derive it from"
            )
        if role.base == "T":
            where = "f_T" if role.index is None else f"f_T[{role.index}]"
            return (
                f"pass it to get_linear_call as {where}, or give the op a JAX reference "
                "(reference=) to derive it from"
            )
        return (
            f"pass it to get_nonlinear_call as f_{role.base}, or give the op a JAX reference "
            "(reference=) to derive it from"
        )

    def give_reference(self) -> str:
        """How the user gives an op its JAX reference."""
        if self.pytree_api:
            return "reference= in the decorator, or @op.def_reference"
        return "reference= to get_linear_call / get_nonlinear_call"

    def differentiable_derivatives(self) -> str:
        """How to make a nonlinear op's JVP and VJP differentiable in turn."""
        if self.pytree_api:
            return (
                "define the JVP and the VJP (@op.def_jvp, @op.def_vjp) as JAX functions: "
                "jaxbind ops, or functions wrapped in jaxbind.jax_function"
            )
        return (
            "give get_nonlinear_call JAX functions as f_jvp and f_vjp: jaxbind ops, or "
            "functions marked with jaxbind.jax_function"
        )

    def kernel_batching(self) -> str:
        """Why an op with compiled kernels cannot take the vectorized option."""
        return (
            f"compiled kernel bodies and {self.vectorized}=True: a kernel batches through "
            f"jaxbind.kernel(..., batches=True) instead; drop {self.vectorized}"
        )


PYTREE_API = Words(
    pytree_api=True,
    fixed="fixed",
    vectorized="vectorized",
    shapes="the shape function",
    callable_contract="A callable returns its results, or writes them into its out= argument",
)
CALLS = Words(
    pytree_api=False,
    fixed="first_n_args_fixed",
    vectorized="func_can_batch",
    shapes="the abstract function",
    callable_contract="A callable writes each result into out[k][...] and returns None",
)


def words(options: Any) -> Words:
    """The vocabulary of the API that made an op with these options (an `Options`: read
    by its ``pytree_api`` flag alone, so that the words sit below the option set)."""
    return PYTREE_API if options.pytree_api else CALLS


class ExportedDefaultNameWarning(UserWarning):
    """An exported program names a binding by a default name with a creation-order suffix
    (``f#2``), which a loading process may give to another binding."""
