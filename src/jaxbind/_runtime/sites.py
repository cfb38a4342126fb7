"""Call sites, as Python sees them: the one life every site has (docs/sites.md).

A site is made once per call site, from the call's attributes alone, by
`instantiate_site`: when XLA instantiates it (every op, every target that has an
instantiate stage), or, where XLA keeps no per-site slot, at its first call; the Instance
that finds it (cpp/site_life.h) lives in XLA's slot until XLA frees the executable, or
where the trampoline keeps it:

1. `describe_site`: from a call's attributes alone (by their names in the program): the
   attributes checked (see _callformat and the definition check's first step), the
   binding's body for the call's role found, and the op's state set up (see .state; on
   the CPU now, on a GPU at each device's first call); a `SiteDescription`, from which
   an ``_ext.Site`` is made.
2. The site's owner (`Binding.sites.own`, see _sites): the programs compiled in this
   process that call it (their lowering keeps a holder alive; the Instance then holds the
   site weakly, so that a site whose callable leads back to the executable is still
   collected), or, for a program compiled elsewhere (jax.export), the executable itself
   (XLA's slot holds the Instance, which holds the site).
3. `SiteDescription.accept`: each buffer signature the site has not seen (the definition
   check's second step; a kernel's address for it).

A site whose op was defined again (replace=True) is made again at its next call, from
the same attributes.

A buffer, wherever Python sees one at run time, is ``(address, shape, XLA element
type)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import _ext
from .._binding import lookup
from .._callformat import CallAttributes
from .._errors import about
from .._kernels import KernelSite
from .._kernels.cuda import CudaKernelSite
from .._kwargs import decode_kwargs
from .._roles import Body, Role, for_call
from .fits import DefinitionCheck, elements
from .old_formats import upgraded
from .state import StatefulBody, lease_for

__all__ = ["SiteDescription", "describe_site", "instantiate_site"]


def instantiate_site(found: dict) -> tuple[_ext.Site, bool]:
    """The site of one call site, from the call's attributes (``found``, with
    ``platform``: "cpu" or "cuda", and ``slot``: whether XLA's per-site slot keeps the
    Instance that finds it), and whether that Instance owns it (see the module
    docstring, step 2)."""
    description = describe_site(found, eager=found.get("platform", "cpu") == "cpu")
    binding = lookup(description.binding)
    assert binding is not None  # (describe_site found it)
    site = _ext.Site(description)
    return binding.sites.own(found["site"], site, slot=found.get("slot", True))


def describe_site(found: dict, eager: bool = False) -> SiteDescription:
    """A call site from its attributes: checked, its body found; its state set up now if
    `eager` (XLA instantiates it on the CPU), else at its first call."""
    call = CallAttributes.read(found)
    name = call.binding
    binding = lookup(name)
    if binding is None:
        raise LookupError(
            f"no binding named '{name}' is registered in this process. Import or run the "
            "code that creates it (jaxbind.get_linear_call / get_nonlinear_call, or the "
            "linear_op / multilinear_op / nonlinear_op decorator) before "
            "calling the program"
        )
    try:
        role = Role.parse(call.role)
    except LookupError:
        raise LookupError(
            f"binding '{name}' ({binding.kind.value}) has no role {call.role!r}"
        ) from None
    call = upgraded(call, binding.options.vectorized)
    dump = decode_kwargs(call.kwargs)
    structure = decode_kwargs(call.trees) if call.trees else None
    kind = binding.role(role).kind
    body: Any = for_call(_body(binding, role), structure, dump)  # of `kind`
    loop = call.loop
    label = f"'{name}' ({role.describe()})"
    check = DefinitionCheck(binding, role, call, dump, structure)
    problem = check.attributes()
    if problem is not None:
        raise ValueError(f"{about(name, role.text)}: {problem}")
    kernel = cuda = None
    stateful = binding.options.state is not None
    if kind in (Body.KERNEL, Body.STREAM_KERNEL, Body.GRAPH_SAFE_KERNEL):
        # compiled, of the kernel ABI: called without the GIL (see cpp/site.h)
        where = f"jaxbind: {label}" + (", batched" if loop.levels else "")
        kernel = body.site_for(dump.to_dict(), where, stateful)
    elif kind is Body.CUDA_KERNEL:  # launched by the trampoline (cpp/cuda_kernels.h)
        cuda = body.site_for(dump.to_dict(), f"jaxbind: {label}")
    elif loop.levels:
        label += ", batched"
    lease = lease_for(binding, role, dump, label, eager)
    if kernel is not None and lease is not None:
        kernel.state = lease.for_kernel(body)
    return SiteDescription(
        binding=name,
        label=label,
        callable=body if lease is None else StatefulBody(body, lease),
        kwargs_dump=dump,
        levels=loop.levels,
        batched=loop.batched,
        platform_mode=binding.options.platform_mode,
        check=check,
        kernel=kernel,
        cuda_kernel=cuda,
    )


@dataclass(frozen=True, slots=True, eq=False)
class SiteDescription:
    """What Python found for one call site, as ``_ext.Site`` reads it (by these
    names) and the GPU dispatcher gets it.

    Attributes:
      binding: the binding's name, and `label` the site's, for messages.
      callable: the body the trampoline calls: a Python callable, or a `Kernel`.
      kwargs_dump: the keyword arguments a Python callable gets.
      levels, batched: jaxbind's batch loop (see `Loop`).
      platform_mode: how a GPU call reaches the callable ("device" or "host").
      check: the call against the binding (`DefinitionCheck`, step 2: the buffers).
      kernel: what the trampoline reads of a kernel (its keyword arguments, whether it
        takes the whole batch, its address per signature), or None.
      cuda_kernel: what it reads of a CUDA kernel (its module, its launch per
        signature), or None.
    """

    binding: str
    label: str
    callable: Any
    kwargs_dump: Any
    levels: int
    batched: tuple[bool, ...]
    platform_mode: str
    check: DefinitionCheck
    kernel: KernelSite | None
    cuda_kernel: CudaKernelSite | None = None

    def accept(self, ins: tuple, outs: tuple) -> tuple[str | None, Any]:
        """``(problem, address)`` for buffers of a signature the site has not seen: what
        the check finds wrong (None if nothing), and a kernel's address for the buffers
        it gets (with jaxbind's loop, one batch element's), or 0; a CUDA kernel's
        launch instead of the address."""
        problem = self.check(ins, outs)
        compiled = self.kernel or self.cuda_kernel
        if problem is not None or compiled is None:
            return problem, 0
        if self.levels and not (self.kernel is not None and self.kernel.batches):
            ins = elements(ins, self.levels, self.batched)
            outs = elements(outs, self.levels, None)
        if self.cuda_kernel is not None:
            return None, self.cuda_kernel.launch(ins, outs)
        assert self.kernel is not None
        return None, self.kernel.address(ins, outs)


def _body(binding, role: Role):
    """The body the trampoline calls for `role`."""
    fn = binding.body(role)
    if binding.role(role).kind.traced:
        raise LookupError(
            f"{role.describe()} of '{binding.name}' is a JAX function, "
            "which programs contain inlined; no call of it goes through the trampoline"
        )
    return fn
