"""The report of one `check`: its rows (`CheckResult`), the table, and the failure message.

A row is "ok", "FAIL", or "not checked": a check that applies to the op but could not
run (a role the op was not given, a function that failed before it) is a row that says
why, never a silent pass. A "derived" row names a rule the op was given no body for, which
its JAX reference computes (JAX's derivative of the reference): a fact about the op, not
a comparison that passed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["CheckReport", "CheckResult", "derived", "not_checked"]


@dataclass(frozen=True)
class CheckResult:
    """One row of a check report.

    Attributes:
      check: which check, e.g. "jvp vs finite differences".
      target: which role, argument or output.
      dtype: the dtype compared ("-" where none).
      error: relative error (or the fraction of bad elements); NaN if not checked.
      tol: the tolerance; NaN if not checked.
      detail: the cause of a failure, why a row was not checked, or how it was computed.
      checked: False for a check that applies but could not run (see ``detail``).
      derived: the row names a rule derived from the op's reference (not a comparison).
    """

    check: str
    target: str
    dtype: str
    error: float
    tol: float
    detail: str = ""
    checked: bool = True
    derived: bool = False

    @property
    def status(self) -> str:
        """The status: "ok", "FAIL", "not checked" or "derived"."""
        if self.derived:
            return "derived"
        if not self.checked:
            return "not checked"
        return "ok" if self.error <= self.tol else "FAIL"

    @property
    def ok(self) -> bool:
        """Checked, and within the tolerance (a row that was not checked is not ok)."""
        return self.status == "ok"


def not_checked(check: str, target: str, why: str) -> CheckResult:
    """A row for a check that applies but could not run, saying why."""
    return CheckResult(check, target, "-", math.nan, math.nan, why, checked=False)


def derived(check: str, target: str, how: str) -> CheckResult:
    """A row naming a rule that the op's reference computes (the op declared none)."""
    return CheckResult(check, target, "-", math.nan, math.nan, how, checked=False, derived=True)


class CheckReport(list[CheckResult]):
    """The rows of one `check` call; ``str(report)`` is a table."""

    def failures(self) -> list[CheckResult]:
        return [r for r in self if r.status == "FAIL"]

    def not_checked(self) -> list[CheckResult]:
        """The checks that apply to the op but could not run, each saying why."""
        return [r for r in self if not r.checked and not r.derived]

    def derived(self) -> list[CheckResult]:
        """The rules the op was given no body for, which its reference computes."""
        return [r for r in self if r.derived]

    def __str__(self) -> str:
        rows = [("check", "target", "dtype", "error", "tol", "")]
        rows += [
            (
                r.check,
                r.target,
                r.dtype,
                f"{r.error:.2e}" if r.checked else "-",
                f"{r.tol:.0e}" if r.checked else "-",
                r.status + (f"  {r.detail}" if r.detail else ""),
            )
            for r in self
        ]
        widths = [max(len(row[k]) for row in rows) for k in range(5)]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(row[:5], widths)) + "  " + row[5] for row in rows
        )

    def message(self, name: str) -> str:
        """The AssertionError's text: each failed row, then the whole table."""
        failures = self.failures()
        lines = [
            f"- {r.check} [{r.target}, {r.dtype}]: error {r.error:.3g} > tol {r.tol:.0e}"
            + (f" ({r.detail})" if r.detail else "")
            for r in failures
        ]
        skipped = len(self.not_checked())
        more = f"\n({skipped} row(s) not checked: see the table)" if skipped else ""
        return (
            f"jaxbind.testing.check: '{name}' failed {len(failures)} check(s):\n"
            + "\n".join(lines)
            + more
            + "\n\n"
            + str(self)
        )
