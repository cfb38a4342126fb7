// The life of a call site: instantiate, find, free. One place owns all three, and the one
// choice of door every call begins with.
//
//   instantiate  XLA instantiates each call site of an executable, for every op and
//                every target registered with an instantiate stage (CPU, CUDA, effect
//                and partitioned targets). `instantiate` asks Python for the site from
//                the call's attributes alone (jaxbind/_runtime/sites.py: the attributes
//                checked, the definition check's first step, the op's state set up on
//                the CPU) and hands XLA an `Instance` to keep in its per-site slot.
//   find         Every call's first step, `find_instance`: one lookup, two doors, the
//                same Instance. The slot door: the instance XLA keeps for the site. The
//                execute-only door (execute_only.h), where XLA keeps none (the host
//                registered no instantiate stage, or keeps no jaxbind object in a slot:
//                jaxlib 0.7): the instance the door keeps for the call's digest, pointed
//                at its site by Python once (`resolve`). Then a compiled body takes the
//                instance's live core without the GIL; a Python body takes its Site with
//                it (`site_of_call`). A dead core (its op was defined again, or its Site
//                went) is made again from the same attributes, and the instance points
//                at the new site.
//   free         XLA frees the executable, and with it the instance (`free_instance`);
//                the execute-only door forgets an instance when its core dies.
//
// Who owns the Python half (the `Site`): the programs compiled in this process that
// call it (their lowering keeps a holder alive, which the garbage collector sees); the
// instance then holds it weakly, so a site whose callable leads back to the executable
// is still collected. A program compiled elsewhere (jax.export) has no holder here: its
// executable owns the site, through the instance in XLA's slot; without a slot, a small
// LRU does (jaxbind/_sites.py). Either way the instance holds the site's core, which
// compiled bodies read without the GIL; a core is alive while its Site is (Site::~Site
// and retire kill it), so a borrowed pointer to the Site is valid, with the GIL held,
// while the core is alive.
#pragma once

#include "boundary.h"
#include "execute_only.h"
#include "floats.h"
#include "xla_slot.h"

namespace jaxbind {

// The doors, as SiteCore::routes records them (for tests; `door_names`).
constexpr uint8_t kBySlot = 1, kByExecuteOnly = execute_only::kDoor;

inline nb::list door_names(const SiteCore &core) {
  uint8_t found = core.routes.load(std::memory_order_relaxed);
  nb::list names;
  if (found & kBySlot) names.append("slot");
  if (found & kByExecuteOnly) names.append("execute-only");
  return names;
}

// The call's attributes, as Python makes a site of them: with the platform, and whether
// XLA's slot keeps the instance (then the executable may own the site).
inline nb::dict instance_attributes(const Header &header, const ffi::Dictionary &attrs,
                                    const char *platform, const Instance &instance) {
  nb::dict found = attributes(header, attrs);
  found["platform"] = platform;
  found["slot"] = instance.door == kBySlot;
  return found;
}

// Point the instance at the site Python makes of the call's attributes, given as
// (site, owned). Needs the GIL.
inline void point(Instance &instance, const Header &header, const ffi::Dictionary &attrs,
                  const char *platform) {
  nb::object answer = process->instantiate(instance_attributes(header, attrs, platform, instance));
  nb::tuple pair = nb::cast<nb::tuple>(answer);
  if (nb::len(pair) != 2 || !nb::isinstance<Site>(pair[0]))
    throw std::runtime_error("instantiate returned no Site");
  bool owned = nb::cast<bool>(pair[1]);
  if (owned && instance.door != kBySlot)  // (the door frees instances without the GIL)
    throw std::runtime_error("instantiate gave a site without a slot to own");
  if (instance.owned) Py_XDECREF(instance.site);
  instance.site = pair[0].ptr();
  instance.owned = owned;
  if (owned) Py_INCREF(instance.site);
  instance.cores.push_back(site_of(pair[0]).core);
  instance.core.store(instance.cores.back().get(), std::memory_order_release);
}

// The execute-only door's resolver in this module: Python's, in the one scope in which
// C++ calls Python.
inline ffi::Error resolve(Instance &instance, const Header &header, const ffi::Dictionary &attrs,
                          const char *platform) {
  PythonScope python;
  IeeeFloats ieee;  // the op's state's setup is Python, as a body (see floats.h)
  return boundary(Where::of_attrs(attrs), [&] {
    python.require();
    if (!process->instantiate.is_valid()) throw PythonGone();
    point(instance, header, attrs, platform);
  });
}

// The one lookup every call begins with: the instance XLA keeps in the site's slot, else
// (none kept) the execute-only door's; or the error the call returns (a program the
// call's header refuses, a site Python refuses).
inline ffi::Error find_instance(const ExecutionContext &context, const RawAttrs &raw,
                                const char *platform, Kept &kept, Instance *&found) {
  found = static_cast<Instance *>(xla_slot::get(context));
  if (found != nullptr) return ffi::Error::Success();
  return execute_only::find(raw, platform, resolve, kept, found);
}

// The same, for a target registered without an instantiate stage (no slot).
inline ffi::Error find_instance(const RawAttrs &raw, const char *platform, Kept &kept,
                                Instance *&found) {
  return execute_only::find(raw, platform, resolve, kept, found);
}

// The site of the call, with its signature accepted (`fn`: a kernel's address for it,
// nullptr for a callable): the instance's, made again if its core is dead. Returns a
// strong reference: the call keeps its site alive even if the body drops the last other
// reference to the binding. Needs the GIL.
inline nb::object site_of_call(Instance &instance, const ffi::Dictionary &attrs, const Call &call,
                               jaxbind_kernel_fn &fn, const char *platform) {
  if (instance.live() == nullptr) {
    Header again;  // (read and checked when the instance was first pointed at its site)
    Header::Problem problem = again.read(attrs);
    if (!problem.message.empty()) throw std::invalid_argument(problem.message);
    point(instance, again, attrs, platform);
  }
  nb::object site = nb::borrow(instance.site);
  site_of(site).core->found_by(instance.door);
  fn = accept(site_of(site), call);
  return site;
}

// XLA's deleter of an Instance: an owned Site dropped with the GIL taken; after the
// interpreter has begun to finalize, deliberately leaked (Python must not be touched).
inline void free_instance(void *kept) {
  auto *instance = static_cast<Instance *>(kept);
  if (instance->owned && instance->site != nullptr) {
    if (!python_is_usable()) return;  // leaked on purpose, with its cores
    nb::gil_scoped_acquire gil;
    Py_DECREF(instance->site);
  }
  delete instance;
}

// The instantiate stage: the site made from the attributes alone and handed to XLA to
// keep; or the error that fails the compilation (or the loading) of the program. Where
// XLA keeps no slot (jaxlib 0.7's API 0.1, a type it refused), nothing is kept, and the
// calls take the execute-only door.
inline ffi::Error instantiate(const ExecutionContext &context, const ffi::Dictionary &attrs,
                              const char *platform) {
  Header header;
  Header::Problem problem = header.read(attrs);
  if (!problem.message.empty()) return refused(attrs, problem);
  if (!xla_slot::keeps_slots(context.api)) return ffi::Error::Success();
  PythonScope python;
  if (!python.ready() || !process->instantiate.is_valid()) return ffi::Error::Success();
  IeeeFloats ieee;  // the op's state's setup is Python, as a body (see floats.h)
  return boundary(Where::of_attrs(attrs), [&] {
    auto *instance = new Instance(kBySlot);
    try {
      point(*instance, header, attrs, platform);
    } catch (...) {
      if (instance->owned) Py_XDECREF(instance->site);
      delete instance;
      throw;
    }
    if (xla_slot::set(context, instance)) return;
    if (instance->owned) Py_XDECREF(instance->site);
    delete instance;
  });
}

}  // namespace jaxbind
