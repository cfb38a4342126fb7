"""Roles: which of a binding's callables a call runs.

  linear       "f" (f, abstract)        <-> "T" (f_T, abstract_T)
  multilinear  "f" (f, abstract);  "T<i>" (f_T[i], abstract_T[i]), the
               transpose with respect to argument i
  nonlinear    "f" (f, abstract);  "jvp" (f_jvp, abstract) <-> "vjp" (f_vjp, abstract_T)

Roles travel as text (in the CallSpec and in a program's ``role`` attribute) and are
parsed once into a :class:`Role`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["Role", "describe_role"]


@dataclass(frozen=True, slots=True)
class Role:
    """One callable of a binding: "f", "T", "jvp", "vjp", or "T<i>" (multilinear).

    Attributes:
      text: the role as programs and CallSpecs carry it.
      base: "f", "T", "jvp" or "vjp".
      index: i for the multilinear transpose "T<i>", else None.
    """

    text: str
    base: str
    index: int | None = None

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def parse(text: str) -> Role:
        """The role named by `text`; LookupError for anything else (it may come from a file)."""
        if text in ("f", "T", "jvp", "vjp"):
            return Role(text, text)
        digits = text[1:]
        if (
            text[:1] == "T"
            and digits.isascii()
            and digits.isdigit()
            and len(digits) <= 6
            and digits == str(int(digits))
        ):
            return Role(text, "T", int(digits))
        raise LookupError(f"there is no role {text!r}")

    def describe(self) -> str:
        if self.base == "f":
            return "the function"
        if self.index is not None:
            return f"the transpose with respect to argument {self.index}"
        if self.base == "T":
            return "the transpose"
        return f"the {self.base.upper()}"


def describe_role(role: str) -> str:
    """Words for a role, for messages ("the transpose", "the JVP", ...)."""
    try:
        return Role.parse(role).describe()
    except LookupError:
        return f"role {role!r}"
