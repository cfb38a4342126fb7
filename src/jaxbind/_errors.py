"""Error messages: every one names the binding, says what to do, and says it in the words
of the API the op was made with.

`words(options)` is that API's vocabulary: the JAX-native API's decorators, ``def_*``
methods and option names (``fixed=``, ``vectorized=``, "the shape function"), or
``get_linear_call`` / ``get_nonlinear_call`` with JAXbind's option names
(``first_n_args_fixed``, ``func_can_batch``, "the abstract function"). Every message
that names an option, a way to give a body or the function that declares shapes takes
the words from here, never writes them itself.

(The text of errors raised inside a running program is made by _runtime.)
"""

from __future__ import annotations

from dataclasses import dataclass

from ._options import Options
from ._roles import Role, describe_role

__all__ = ["ExportedDefaultNameWarning", "Words", "about", "add_context", "words"]


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


@dataclass(frozen=True, slots=True)
class Words:
    """The words of one API.

    Attributes:
      native: the JAX-native API (decorators), else JAXbind's ``get_*_call``.
      fixed: the option that counts the fixed leading arguments.
      vectorized: the option by which the callables batch themselves.
      shapes: what declares the output shapes ("the shape function").
      callable_contract: how a callable hands back its results.
    """

    native: bool
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
        if self.native:
            if role.base == "T":
                argnum = "" if role.index is None else f"(argnum={role.index})"
                return f"define it with the op's @op.def_transpose{argnum} decorator"
            return f"define it with the op's @op.def_{role.base} decorator"
        if role.base == "T":
            where = "f_T" if role.index is None else f"f_T[{role.index}]"
            return f"pass it to get_linear_call as {where}"
        return f"pass it to get_nonlinear_call as f_{role.base}"

    def differentiable_derivatives(self) -> str:
        """How to make a nonlinear op's JVP and VJP differentiable in turn."""
        if self.native:
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


NATIVE = Words(
    native=True,
    fixed="fixed",
    vectorized="vectorized",
    shapes="the shape function",
    callable_contract="A callable returns its results, or writes them into its out= argument",
)
CALLS = Words(
    native=False,
    fixed="first_n_args_fixed",
    vectorized="func_can_batch",
    shapes="the abstract function",
    callable_contract="A callable writes each result into out[k][...] and returns None",
)


def words(options: Options) -> Words:
    """The vocabulary of the API that made an op with these `Options`."""
    return NATIVE if options.native else CALLS


class ExportedDefaultNameWarning(UserWarning):
    """An exported program names a binding by a default name with a creation-order suffix
    (``f#2``), which a loading process may give to another binding."""
