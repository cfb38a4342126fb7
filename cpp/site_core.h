// jaxbind's trampoline and C runtime: a call site's core, and the Instance a call finds it
// through (its life, from instantiate to free, and the two doors to an Instance:
// site_life.h). Nothing here touches Python.
//
// A site is a binding's body for one role, set of keyword arguments and batch loop. Its
// `SiteCore` is everything a call needs but Python (its label, loop, the signatures its
// check accepted, a kernel's keyword arguments); counted, so that a call in flight keeps
// it alive, and read without the GIL by compiled bodies. In the trampoline it is alive
// while its Site is (site.h: the Python half, which kills it when it goes or is
// retired), and a call that finds a dead core finds its site again; the C runtime's
// cores, made from a bundle's manifest, live as long as the process.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "call.h"
#include "counted.h"
#include "cuda_kernels.h"
#include "kernels.h"

struct _object;  // Python's PyObject: the trampoline's Site (the C runtime has none)

namespace jaxbind {

struct SiteCore {
  std::atomic<int> refs{0};  // see CoreRef
  std::string label;         // "'<binding>' (<role>)", for errors
  Loop loop;
  bool is_kernel = false;
  bool whole_batch = false;              // the kernel takes the whole batch (batches=True)
  KernelSite kernel;                     // a kernel's ABI version, threads and keyword arguments
  std::unique_ptr<CudaKernelSite> cuda;  // a CUDA kernel's module and launches, or none
  AcceptedSignatures<jaxbind_kernel_fn> accepted;  // with the kernel's address for each
  // Cleared when its Site goes or is retired (`die`): a pointer to it kept elsewhere is
  // stale.
  std::atomic<bool> alive{true};
  // The doors that found it (site_life.h's door bits), for tests: read with the GIL.
  std::atomic<uint8_t> routes{0};
  void found_by(uint8_t door) {
    if ((routes.load(std::memory_order_relaxed) & door) == 0)
      routes.fetch_or(door, std::memory_order_relaxed);
  }
  // The call's `site` attribute, where a table keeps the core's instance by it (0: none).
  // Written and read under that table's lock.
  int64_t digest = 0;
  // Told once, with the GIL held, when a core dies (the table forgets its instance).
  static inline std::atomic<void (*)(SiteCore &)> on_death{nullptr};
  void die() {
    if (!alive.exchange(false, std::memory_order_acq_rel)) return;
    if (auto told = on_death.load(std::memory_order_acquire)) told(*this);
  }
  // Unique in the process (addresses of freed cores are reused): the key of threads' caches.
  uint64_t id = next_id.fetch_add(1) + 1;
  static inline std::atomic<uint64_t> next_id{0};
};

// A counted reference to a SiteCore (counted.h).
using CoreRef = Counted<SiteCore>;

// What a call finds its site through, whichever door it came by (site_life.h): the site's
// core, for calls without the GIL, and the Site, for calls with it. Pointed at another
// site when its core dies (the op defined again, or its Site gone), from the same
// attributes.
struct Instance {
  explicit Instance(uint8_t door) : door(door) {}
  const uint8_t door;                     // the door that keeps it (site_life.h)
  std::atomic<int> refs{0};               // InstanceRef's, where a table keeps it
  std::atomic<SiteCore *> core{nullptr};  // the current site's core, read without the GIL
  std::vector<CoreRef> cores;             // every core it pointed at, kept: readers hold no count
  _object *site = nullptr;  // the Site: owned, or borrowed (valid while `core` is alive)
  bool owned = false;

  // The current site's core if it is alive, else nullptr (the call takes the GIL path,
  // which points the instance at a site again).
  SiteCore *live() const {
    SiteCore *found = core.load(std::memory_order_acquire);
    return found != nullptr && found->alive.load(std::memory_order_acquire) ? found : nullptr;
  }
};
using InstanceRef = Counted<Instance>;

// The instance a call frame found last where no slot keeps one (site_life.h), by the
// call's digest: counted, so that it (and the cores it points at) stays alive while the
// frame's call uses it, whatever a nested call finds meanwhile.
struct Kept {
  int64_t digest = 0;
  InstanceRef instance;
};

// The signature a thread matched last, of which core, with its kernel's address: most
// calls repeat their thread's last, which then costs one comparison and no lock.
struct LastAccepted {
  uint64_t core_id = 0;  // SiteCore::id (unique in the process)
  Signature signature;
  jaxbind_kernel_fn fn = nullptr;
};

inline LastAccepted &last_accepted() {
  thread_local LastAccepted last;
  return last;
}

// Whether `core` has accepted the call's signature (without the GIL), and its kernel's
// address for it (nullptr for a callable).
inline bool accepted_before(SiteCore &core, const Call &call, jaxbind_kernel_fn &fn) {
  LastAccepted &last = last_accepted();
  if (last.core_id == core.id && last.signature.matches(call)) {
    fn = last.fn;
    return true;
  }
  if (!core.accepted.find(call, fn)) return false;
  last.core_id = core.id;
  last.signature = Signature::of(call);
  last.fn = fn;
  return true;
}

// A compiled body's core, without the GIL: the instance's if alive (else nullptr: the
// call takes the GIL path, `site_of_call`).
inline SiteCore *live_core(Instance &instance) {
  SiteCore *core = instance.live();
  if (core != nullptr) core->found_by(instance.door);
  return core;
}

}  // namespace jaxbind
