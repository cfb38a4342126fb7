// The digest route: call sites found by the digest a call carries, where XLA keeps no
// per-site slot. Quarantined: every other call finds its site in XLA's slot (site_life.h).
//
// Two things still need it, and deleting this file (with jaxbind/_runtime/digest_route.py)
// takes both gone:
// - jaxlib 0.7 (FFI API 0.1), whose slot objects carry their own deleter: freeing an
//   executable with jaxbind's object in its slot aborted the process once in CI, so none is
//   set there
//   (xla_slot.h, keeps_slots);
// - targets registered without an instantiate stage: the CUDA-kernel target (see
//   jaxbind/_rules/targets.py, its "stages" column).
//
// A site's first call crosses into Python once: the resolver checks the attributes,
// makes the Site and accepts the call's buffers. The table `process->sites` holds sites
// weakly (the programs that call them own them: Binding.keep_site); kernel sites' cores
// are also in `fast_sites`, where calls that run without the GIL find them.
#pragma once

#include <mutex>
#include <unordered_map>

#include "site.h"

namespace jaxbind {

// Kernel sites' cores by digest, for calls that run without the GIL.
inline std::mutex fast_mu;
inline std::unordered_map<int64_t, CoreRef> fast_sites;  // digest -> a kernel site's core

// What each thread keeps of the digest route between kernel calls: the last kernel site
// it found by digest.
struct DigestCache {
  int64_t digest = 0;
  CoreRef core;  // keeps the core alive while this thread uses it
};

inline DigestCache &digest_cache() {
  thread_local DigestCache cache;
  return cache;
}

// A kernel site's core by the call's digest, without the GIL (this thread's last, or the
// table's); nullptr: none known, the call takes the GIL path.
inline SiteCore *core_by_digest(const RawAttrs &attrs) {
  DigestCache &cache = digest_cache();
  int64_t digest = 0;
  if (!attrs.site(digest)) return nullptr;
  if (!cache.core || cache.digest != digest || !cache.core->alive.load(std::memory_order_acquire)) {
    std::lock_guard lock(fast_mu);
    auto it = fast_sites.find(digest);
    if (it == fast_sites.end()) return nullptr;  // (its format was checked when resolved)
    cache.digest = digest;
    cache.core = it->second;
  }
  return cache.core.get();
}

// Keep a site the resolver made in the tables, unless another thread resolved the same
// digest meanwhile: its site stays the one (replacing the entry would drop the weak
// reference whose callback forgets that site's entries when it goes).
inline nb::object keep(int64_t digest, nb::object found) {
  auto &sites = process->sites;
  auto again = sites.find(digest);
  if (again != sites.end()) return nb::borrow(again->second.site);
  CoreRef core = site_of(found).core;
  nb::object forget = nb::cpp_function([digest, core](nb::handle ref) {
    if (process == nullptr) return;
    auto entry = process->sites.find(digest);
    if (entry != process->sites.end() && entry->second.ref.ptr() == ref.ptr())
      process->sites.erase(entry);
    std::lock_guard lock(fast_mu);
    auto fast = fast_sites.find(digest);
    if (fast != fast_sites.end() && fast->second == core) fast_sites.erase(fast);
  });
  sites.emplace(digest, Entry{found.ptr(), nb::weakref(found, forget)});
  if (core->is_kernel || core->cuda) {
    std::lock_guard lock(fast_mu);
    fast_sites.insert_or_assign(digest, core);
  }
  return found;
}

// The site of the call's digest, with the call's signature accepted (`fn`: the kernel's
// address for it, nullptr for a callable): the table's, else one call of the resolver
// checks every attribute, makes the site and accepts the buffers. Needs the GIL.
inline nb::object site_by_digest(const Header &header, const ffi::Dictionary &attrs,
                                 const Call &call, jaxbind_kernel_fn &fn) {
  auto it = process->sites.find(header.site);
  if (it != process->sites.end()) {
    nb::object site = nb::borrow(it->second.site);
    fn = accept(site_of(site), call);
    return site;
  }
  nb::object answer =
      process->resolver(attributes(header, attrs), describe(call.ins), describe(call.outs));
  nb::tuple parts = nb::cast<nb::tuple>(answer);  // (site, problem, address)
  if (nb::len(parts) != 3 || !nb::isinstance<Site>(parts[0]))
    throw std::runtime_error("the resolver returned no Site");
  nb::object site = keep(header.site, nb::borrow(parts[0]));
  if (site.ptr() != parts[0].ptr())  // another thread's: its own check
    fn = accept(site_of(site), call);
  else
    fn = take_answer(site_of(site), call, nb::make_tuple(parts[1], parts[2]));
  return site;
}

}  // namespace jaxbind
