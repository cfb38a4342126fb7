// jaxbind's trampoline: call sites, found by the digest a call carries (see
// jaxbind/_callformat.py), and what a site's first call and each new signature ask of
// Python.
//
// A site is a binding's body for one role, set of keyword arguments and batch loop,
// resolved once. It has two parts:
// - `SiteCore`, everything a call needs but Python (its label, loop, the signatures its
//   check accepted, a kernel's keyword arguments); counted, so that a call in flight
//   keeps it alive. A kernel site's core is also in `fast_sites`, where the CPU handler
//   finds it without the GIL.
// - `Site`, a Python object (`_ext.Site`) made from the resolver's description (see
//   jaxbind/_runtime/resolve.py, Resolved): the callable, its keyword arguments, the
//   check. Its binding owns it; the table `sites` holds it weakly, and the garbage
//   collector sees everything it holds (site_traverse), so a cycle through the user's
//   callable and the op is collected like any other.
//
// Where XLA instantiates the call sites of an executable (the FFI instantiate stage: XLA
// 0.7 and later, on the CPU), the executable owns its sites: the instantiate handler
// asks Python for the site from the call's attributes alone (`instantiate` below; the
// op's state is set up then), and XLA keeps it as the site's state (`Instantiated`)
// until it frees the executable; each call reads it (xla_state::get), and its first
// call with a signature crosses into Python once, to `accept`. Where XLA kept no state,
// a call finds its site by digest instead, as follows.
//
// A site's first call crosses into Python once: the resolver checks the attributes,
// makes the Site and accepts the call's buffers (checks them against the binding's
// abstract function and, for a kernel, gives its address for their signature). A later
// call with a new signature crosses once more, to `accept`.
#pragma once

#include <atomic>
#include <unordered_map>

#include "call.h"
#include "cuda_kernels.h"
#include "kernels.h"
#include "process.h"
#include "xla_state.h"

namespace jaxbind {

struct SiteCore {
  std::atomic<int> refs{0};  // see CoreRef
  std::string label;         // "'<binding>' (<role>)", for errors
  Loop loop;
  bool is_kernel = false;
  bool whole_batch = false;              // the kernel takes the whole batch (batches=True)
  KernelSite kernel;                     // a kernel's ABI version, threads and keyword arguments
  std::unique_ptr<CudaKernelSite> cuda;  // a CUDA kernel's module and launches, or none
  Accepted accepted;
  // Cleared when its Site goes: a thread's cached pointer to it is then stale.
  std::atomic<bool> alive{true};
  // Unique in the process (addresses of freed cores are reused): the key of threads' caches.
  uint64_t id = next_id.fetch_add(1) + 1;
  static inline std::atomic<uint64_t> next_id{0};
};

// A counted reference to a SiteCore. Not std::shared_ptr: libstdc++'s reference counts
// read glibc's __libc_single_threaded (glibc 2.32), newer than the manylinux_2_28 wheel
// may need.
class CoreRef {
 public:
  CoreRef() = default;
  explicit CoreRef(SiteCore *core) : core_(core) {
    if (core_) core_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  CoreRef(const CoreRef &other) : CoreRef(other.core_) {}
  CoreRef(CoreRef &&other) noexcept : core_(other.core_) { other.core_ = nullptr; }
  CoreRef &operator=(CoreRef other) noexcept {
    std::swap(core_, other.core_);
    return *this;
  }
  ~CoreRef() {
    if (core_ && core_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete core_;
  }
  SiteCore *get() const { return core_; }
  SiteCore *operator->() const { return core_; }
  explicit operator bool() const { return core_ != nullptr; }
  bool operator==(const CoreRef &other) const { return core_ == other.core_; }

 private:
  SiteCore *core_ = nullptr;
};

// A site's GPU plan (jaxbind/_runtime/gpu.py, Plan; run by gpu.h), made for one stream,
// device and batch element's signature.
struct GpuPlan {
  nb::object plan, views;  // the plan, and its views (the inputs', then the outputs')
  uintptr_t stream = 0;
  int32_t device = -1;
  Signature signature;
  // The reference counts of `views` and of each view between calls: higher after a
  // call, the callable kept it.
  std::vector<Py_ssize_t> refs;
  bool busy = false;  // a call is inside it
};

struct Site {
  CoreRef core;
  // From the resolver's description (kept whole for the GPU plan maker).
  nb::object resolved, callable, kwargs_dump, label, accept;
  std::string binding;  // for error messages
  // The views of the site's last call, when the callable kept no reference to them:
  // the next call points them at its buffers instead of building new ones (views.h).
  nb::object out_views, in_views;
  GpuPlan gpu;  // the plan of the site's last GPU call (gpu.h)
  // Sites alive in the process, whoever owns them (programs, executables, the digest
  // table's entries): _ext.site_count. Counted by a member, so that a constructor that
  // throws counts nothing.
  static inline std::atomic<int64_t> alive{0};
  struct Counted {
    Counted() { alive.fetch_add(1, std::memory_order_relaxed); }
    Counted(const Counted &) : Counted() {}
    ~Counted() { alive.fetch_sub(1, std::memory_order_relaxed); }
  } counted;

  // Read the description: callable, kwargs_dump, label, binding, levels, batched, accept
  // and kernel (None, or what jaxbind/_kernels' KernelCall gives: batches, abi_version,
  // threads, kwargs and origin).
  explicit Site(nb::handle description) : core(new SiteCore()) {
    resolved = nb::borrow(description);
    callable = description.attr("callable");
    kwargs_dump = description.attr("kwargs_dump");
    label = description.attr("label");
    accept = description.attr("accept");
    binding = nb::cast<std::string>(description.attr("binding"));
    core->label = nb::cast<std::string>(label);
    core->loop.levels = nb::cast<int>(description.attr("levels"));
    if (core->loop.levels < 0 || core->loop.levels > Loop::kMaxLevels)
      throw std::invalid_argument("the call's batch levels are out of range");
    for (bool b : nb::cast<std::vector<bool>>(description.attr("batched")))
      core->loop.batched.push_back(b ? 1 : 0);
    nb::object kernel = description.attr("kernel");
    if (!kernel.is_none()) {
      core->is_kernel = true;
      core->whole_batch = nb::cast<bool>(kernel.attr("batches"));
      core->kernel.abi_version = nb::cast<int64_t>(kernel.attr("abi_version"));
      core->kernel.threads = nb::cast<int64_t>(kernel.attr("threads"));
      core->kernel.kwargs.read(kernel.attr("kwargs"));
      core->kernel.origin = nb::cast<std::string>(kernel.attr("origin"));
      read_state(kernel.attr("state"));
    }
    nb::object cuda = description.attr("cuda_kernel");
    if (!cuda.is_none()) {
      nb::bytes image = nb::cast<nb::bytes>(cuda.attr("image"));
      core->cuda = std::make_unique<CudaKernelSite>(std::string(image.c_str(), image.size()),
                                                    nb::cast<std::string>(cuda.attr("entry")));
    }
  }

  // A kernel's state (jaxbind/_kernels' KernelCall.state): None, or (cell, key inputs,
  // serial tasks, lease): a cell (_ext.StateCell) for a state without key, else the key
  // inputs' positions and the lease that gives a cell per key value.
  void read_state(nb::handle state) {
    if (state.is_none()) return;
    nb::tuple t = nb::cast<nb::tuple>(state);
    KernelState &s = core->kernel.state;
    s.serial_tasks = nb::cast<bool>(t[2]);
    if (!t[0].is_none()) {
      s.cell = nb::cast<CellHandle &>(t[0]).cell;
      return;
    }
    s.keyed = std::make_unique<KeyedCells>(nb::cast<std::vector<int>>(t[1]), t[3], core->label);
  }
};

inline Site &site_of(nb::handle obj) { return *nb::inst_ptr<Site>(obj); }

// Kernel sites' cores by digest, for calls that run without the GIL.
inline std::mutex fast_mu;
inline std::unordered_map<int64_t, CoreRef> fast_sites;  // digest -> a kernel site's core

// A call's buffers as Python sees them: a tuple of (address, shape, XLA element type).
inline nb::tuple describe(const std::vector<Buffer> &buffers) {
  nb::list items;
  for (const Buffer &b : buffers) {
    nb::list shape;
    for (int64_t d = 0; d < b.rank; ++d) shape.append(b.dims[d]);
    items.append(nb::make_tuple(reinterpret_cast<uintptr_t>(b.data), nb::tuple(shape),
                                static_cast<int>(b.dtype)));
  }
  return nb::tuple(items);
}

// What the site's check said of a signature: (problem or None, kernel address or 0; for
// a CUDA kernel, its launch). Remembers an accepted one (a CUDA kernel's, with its
// launch: its site knows its signatures there alone).
inline jaxbind_kernel_fn accepted(Site &site, const Call &call, nb::handle answer) {
  nb::tuple pair = nb::cast<nb::tuple>(answer);
  if (!pair[0].is_none()) throw std::invalid_argument(nb::cast<std::string>(pair[0]));
  if (site.core->cuda) {
    site.core->cuda->add(call, read_launch(pair[1]));
    return nullptr;
  }
  auto address = nb::cast<uintptr_t>(pair[1]);
  if (site.core->is_kernel && address == 0) throw std::runtime_error("the kernel's address is 0");
  auto fn = reinterpret_cast<jaxbind_kernel_fn>(address);
  site.core->accepted.add(Signature::of(call), fn);
  return fn;
}

// The kernel's address for the call's signature (nullptr for a callable), after the
// site's check accepted it, in Python if it is new. Needs the GIL.
inline jaxbind_kernel_fn accept(Site &site, const Call &call) {
  jaxbind_kernel_fn fn = nullptr;
  SiteCore &core = *site.core.get();
  if (core.cuda ? core.cuda->find(call) != nullptr : core.accepted.find(call, fn)) return fn;
  return accepted(site, call, site.accept(describe(call.ins), describe(call.outs)));
}

// Keep a site the resolver made in the tables, unless another thread resolved the same
// digest meanwhile: its site stays the one (replacing the entry would drop the weak
// reference whose callback marks that site's core dead when its binding goes).
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
    core->alive.store(false, std::memory_order_release);
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

// What XLA keeps for an instantiated call site, until it frees the executable: the Site
// (a strong reference) and its core (read without the GIL by kernel calls).
struct Instantiated {
  CoreRef core;
  PyObject *site;  // owned
};

// XLA's deleter of an Instantiated: the Site dropped with the GIL taken; after the
// interpreter has begun to finalize, deliberately leaked (Python must not be touched).
inline void free_instantiated(void *kept) {
  auto *held = static_cast<Instantiated *>(kept);
  if (python_is_usable()) {
    nb::gil_scoped_acquire gil;
    Py_DECREF(held->site);
  }
  delete held;
}

// The site XLA keeps for the call being run, or nullptr (none kept, or its binding was
// defined again with replace=True since: then the call finds its site by digest).
inline Instantiated *instantiated(const ExecutionContext &context) {
  auto *held = static_cast<Instantiated *>(xla_state::get(context));
  if (held == nullptr || !held->core->alive.load(std::memory_order_acquire)) return nullptr;
  return held;
}

// The call's attributes for the resolver, by their names in the program: those of the
// call's format that are there with the right type (the resolver says what is missing).
inline nb::dict attributes(const Header &header, const ffi::Dictionary &attrs) {
  nb::dict found;
  found["jaxbind_format"] = header.format;
  found["site"] = header.site;
  auto text = [&](const char *name) {
    std::string_view value;
    if (get_attr(attrs, name, value)) found[name] = nb::str(value.data(), value.size());
  };
  auto bytes = [&](const char *name) {
    ffi::Span<const uint8_t> value;
    if (get_attr(attrs, name, value))
      found[name] = nb::bytes(reinterpret_cast<const char *>(value.begin()), value.size());
  };
  auto int32 = [&](const char *name) {
    int32_t value;
    if (get_attr(attrs, name, value)) found[name] = value;
  };
  text("binding");
  text("role");
  bytes("kwargs");
  int32("loop_levels");
  bytes("loop_batched");
  int32("n_fixed");
  bytes("trees");
  text("definition");
  return found;
}

// The site a call names, with the call's signature accepted, and the kernel's address
// for it (nullptr for a callable). A cached site needs only the digest; on a miss, one
// call of the resolver checks every attribute, makes the site and accepts the buffers.
// Returns a strong reference: the call keeps its site alive even if the callable drops
// the last other reference to the binding.
inline nb::object resolve(const Header &header, const ffi::Dictionary &attrs, const Call &call,
                          jaxbind_kernel_fn &fn, Instantiated *held) {
  if (held != nullptr) {
    nb::object site = nb::borrow(held->site);
    fn = accept(site_of(site), call);
    return site;
  }
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
    fn = accepted(site_of(site), call, nb::make_tuple(parts[1], parts[2]));
  return site;
}

// The instantiate stage of a call site: its Site, from the attributes alone (the
// resolver's first step, and on the CPU the op's state set up), handed to XLA to keep. Needs the
// GIL. False if XLA keeps no state (then calls find the site by digest).
inline bool instantiate(const ExecutionContext &context, const Header &header,
                        const ffi::Dictionary &attrs, const char *platform) {
  nb::dict found = attributes(header, attrs);
  found["platform"] = platform;
  nb::object site = process->instantiate(found);
  if (site.is_none()) return false;  // an op without state: resolved at its first call
  if (!nb::isinstance<Site>(site)) throw std::runtime_error("instantiate returned no Site");
  auto *held = new Instantiated{site_of(site).core, site.release().ptr()};
  if (xla_state::set(context, held)) return true;
  Py_DECREF(held->site);
  delete held;
  return false;
}

}  // namespace jaxbind
