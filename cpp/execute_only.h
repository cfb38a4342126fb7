// The execute-only door: the Instance of a call whose host keeps no per-site slot,
// found by the digest the call carries (its `site` attribute). Hosts that register an
// execute stage only need it:
// - jaxlib 0.7 (FFI API 0.1), whose slot objects carry their own deleter: freeing an
//   executable with jaxbind's object in its slot aborted the process once in CI, so none
//   is set there (xla_slot.h, keeps_slots);
// - the CUDA-kernel target, registered with its execute stage alone, so that XLA may
//   capture its launches into command buffers (jaxbind/_rules/targets.py, "stages");
// - any PJRT host written in C (jaxbind's C runtime, cpp/runtime/, finds every call here).
// The other door, XLA's slot, and the one place that chooses between them: site_life.h.
//
// A digest's first call asks the host runtime's resolver to point a new Instance at the
// call's site, once; the door keeps the instance by digest, and each call frame its last
// one (Kept, site_core.h), so that later calls find it with one comparison, without a lock or
// the GIL. The door depends on no runtime but through the resolver (the trampoline's:
// Python's instantiate_site, site_life.h; the C runtime's: the site it made of the
// bundle's manifest, cpp/runtime/), and touches no Python. An instance here never owns
// its site: the resolver's runtime does (Python's: the programs that call it, or a small
// LRU, jaxbind/_sites.py; the C runtime's: its registry). When the site's core dies (its
// Site gone, or retired) the door forgets the instance, and the next call resolves the
// digest again.
#pragma once

#include <mutex>
#include <unordered_map>

#include "callformat.h"
#include "errors.h"
#include "site_core.h"

namespace jaxbind::execute_only {

// Points `instance` at the site of the call (its header read and checked), or says why
// not: the error the call returns. The instance must not own the site (the door frees
// instances without a runtime's lock).
using Resolver = ffi::Error (*)(Instance &instance, const Header &header,
                                const ffi::Dictionary &attrs, const char *platform);

// The instances by digest, each pointing at a live core (or about to be forgotten).
inline std::mutex mu;
inline std::unordered_map<int64_t, InstanceRef> instances;

// Its bit in SiteCore::routes (site_life.h's other door, XLA's slot: 1).
inline constexpr uint8_t kDoor = 2;

// A core died (SiteCore::on_death): its instance leaves the table (threads that kept it
// let it go at their next call, which finds the core dead).
inline void forget(SiteCore &core) {
  InstanceRef gone;  // (released after the lock)
  std::lock_guard lock(mu);
  auto it = instances.find(core.digest);
  if (it != instances.end() && it->second->core.load(std::memory_order_acquire) == &core) {
    gone = std::move(it->second);
    instances.erase(it);
  }
}

// The table's live instance of `digest`, or none.
inline InstanceRef kept(int64_t digest) {
  std::lock_guard lock(mu);
  auto it = instances.find(digest);
  if (it == instances.end() || it->second->live() == nullptr) return {};
  return it->second;
}

// Keep a resolved instance, unless another thread resolved the digest meanwhile: its
// instance stays the one (both point at the site the runtime keeps for the digest).
inline InstanceRef keep(int64_t digest, InstanceRef made) {
  InstanceRef dead;  // (released after the lock)
  std::lock_guard lock(mu);
  auto it = instances.find(digest);
  if (it != instances.end() && it->second->live() != nullptr) return it->second;
  SiteCore::on_death.store(forget, std::memory_order_release);
  SiteCore *core = made->core.load(std::memory_order_acquire);
  core->digest = digest;
  if (it != instances.end()) {
    dead = std::move(it->second);
    it->second = made;
  } else {
    instances.emplace(digest, made);
  }
  // A core that died before the hook could see it: forget it here (see `forget`).
  if (!core->alive.load(std::memory_order_acquire)) instances.erase(digest);
  return made;
}

// The instance of a call not found in its frame's `mine` (its first, or after its site
// died): the table's, else a new one the resolver points at the call's site.
inline ffi::Error find_kept(const RawAttrs &raw, const char *platform, Resolver resolve, Kept &mine,
                            Instance *&found) {
  ffi::Dictionary attrs = raw.dict();
  Header header;
  Header::Problem problem = header.read(attrs);
  if (!problem.message.empty()) return refused(attrs, problem);
  InstanceRef instance = kept(header.site);
  if (!instance) {
    InstanceRef made(new Instance(kDoor));
    ffi::Error resolved = resolve(*made, header, attrs, platform);
    if (resolved.failure()) return resolved;
    instance = keep(header.site, std::move(made));
  }
  mine.digest = header.site;
  mine.instance = std::move(instance);
  found = mine.instance.get();
  return ffi::Error::Success();
}

// The instance of the call: the one its frame kept if it is the call's and alive (one
// comparison, no lock), else `find_kept`'s.
inline ffi::Error find(const RawAttrs &raw, const char *platform, Resolver resolve, Kept &mine,
                       Instance *&found) {
  int64_t digest = 0;
  if (mine.instance && raw.site(digest) && digest == mine.digest &&
      mine.instance->live() != nullptr) {
    found = mine.instance.get();
    return ffi::Error::Success();
  }
  return find_kept(raw, platform, resolve, mine, found);
}

}  // namespace jaxbind::execute_only
