// The life of a call site: instantiate, find, free. One place owns all three.
//
//   instantiate  XLA instantiates each call site of an executable, for every op and
//                every target registered with an instantiate stage (CPU, CUDA, effect
//                and partitioned targets). `instantiate` asks Python for the site from
//                the call's attributes alone (jaxbind/_runtime/sites.py: the attributes
//                checked, the definition check's first step, the op's state set up on
//                the CPU) and hands XLA an `Instance` to keep in its per-site slot.
//   find         Every call's first step (`instance_of`, then `find_core` without the
//                GIL or `find_site` with it). A dead core (its op was defined again, or
//                its Site retired) is instantiated again, from the same attributes, and
//                the instance points at the new site.
//   free         XLA frees the executable, and with it the instance (`free_instance`).
//
// Who owns the Python half (the `Site`): the programs compiled in this process that
// call it (their lowering keeps a holder alive, which the garbage collector sees); the
// instance then holds it weakly, so a site whose callable leads back to the executable
// is still collected. A program compiled elsewhere (jax.export) has no holder here: its
// executable owns the site, through the instance. Either way the instance holds the
// site's core, which compiled bodies read without the GIL; a core is alive while its
// Site is (Site::~Site and retire mark it dead), so a borrowed pointer to the Site is
// valid, with the GIL held, while the core is alive.
//
// Where XLA keeps no slot (jaxlib 0.7; the CUDA-kernel target, execute stage only),
// calls take the digest route instead: digest_route.h, quarantined.
#pragma once

#include <atomic>
#include <vector>

#include "digest_route.h"
#include "xla_slot.h"

namespace jaxbind {

// How a call found its site (SiteCore::routes, for tests).
constexpr uint8_t kBySlot = 1, kByDigest = 2;

// What XLA keeps in its per-site slot until it frees the executable.
struct Instance {
  std::atomic<SiteCore *> core{nullptr};  // the current site's core, read without the GIL
  std::vector<CoreRef> cores;             // every core it pointed at, kept: readers hold no count
  PyObject *site = nullptr;  // the Site: owned, or borrowed (valid while `core` is alive)
  bool owned = false;

  // Point at a site Python gave: (site, owned). Needs the GIL.
  void point(nb::handle answer) {
    nb::tuple pair = nb::cast<nb::tuple>(answer);
    if (nb::len(pair) != 2 || !nb::isinstance<Site>(pair[0]))
      throw std::runtime_error("instantiate returned no Site");
    if (owned) Py_XDECREF(site);
    site = pair[0].ptr();
    owned = nb::cast<bool>(pair[1]);
    if (owned) Py_INCREF(site);
    cores.push_back(site_of(pair[0]).core);
    core.store(cores.back().get(), std::memory_order_release);
  }
};

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

// The instance XLA keeps for the call being run, or nullptr (the digest route).
inline Instance *instance_of(const ExecutionContext &context) {
  return static_cast<Instance *>(xla_slot::get(context));
}

// The call's attributes, as the instantiate stage gives them to Python.
inline nb::dict instance_attributes(const Header &header, const ffi::Dictionary &attrs,
                                    const char *platform) {
  nb::dict found = attributes(header, attrs);
  found["platform"] = platform;
  return found;
}

// The instantiate stage: the site made from the attributes alone and handed to XLA to
// keep. Needs the GIL. False if XLA keeps no slot (then calls take the digest route).
inline bool instantiate(const ExecutionContext &context, const Header &header,
                        const ffi::Dictionary &attrs, const char *platform) {
  auto *instance = new Instance();
  try {
    instance->point(process->instantiate(instance_attributes(header, attrs, platform)));
  } catch (...) {
    if (instance->owned) Py_XDECREF(instance->site);
    delete instance;
    throw;
  }
  if (xla_slot::set(context, instance)) return true;
  if (instance->owned) Py_XDECREF(instance->site);
  delete instance;
  return false;
}

// A compiled body's core, without the GIL: the instance's if alive, else the digest
// route's; nullptr: the call takes the GIL path (`find_site`).
inline SiteCore *find_core(const RawAttrs &attrs, Instance *instance) {
  if (instance != nullptr) {
    SiteCore *core = instance->core.load(std::memory_order_acquire);
    if (core == nullptr || !core->alive.load(std::memory_order_acquire)) return nullptr;
    core->found_by(kBySlot);
    return core;
  }
  SiteCore *core = core_by_digest(attrs);
  if (core != nullptr) core->found_by(kByDigest);
  return core;
}

// The site of the call, with its signature accepted (`fn`: a kernel's address for it,
// nullptr for a callable): the instance's (instantiated again if its core is dead), else
// the digest route's. Returns a strong reference: the call keeps its site alive even if
// the body drops the last other reference to the binding. Needs the GIL.
inline nb::object find_site(const Header &header, const ffi::Dictionary &attrs, const Call &call,
                            jaxbind_kernel_fn &fn, Instance *instance, const char *platform) {
  if (instance == nullptr) {  // (the caller read the header: the digest route needs it)
    nb::object site = site_by_digest(header, attrs, call, fn);
    site_of(site).core->found_by(kByDigest);
    return site;
  }
  SiteCore *core = instance->core.load(std::memory_order_acquire);
  if (core == nullptr || !core->alive.load(std::memory_order_acquire)) {
    Header again;  // (read and checked when XLA instantiated the site)
    Header::Problem problem = again.read(attrs);
    if (!problem.message.empty()) throw std::invalid_argument(problem.message);
    instance->point(process->instantiate(instance_attributes(again, attrs, platform)));
  }
  nb::object site = nb::borrow(instance->site);
  site_of(site).core->found_by(kBySlot);
  fn = accept(site_of(site), call);
  return site;
}

}  // namespace jaxbind
