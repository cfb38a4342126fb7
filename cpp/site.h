// jaxbind's trampoline: what a call site is, and the Instance a call finds it through
// (its life, from instantiate to free, and the two doors to an Instance: site_life.h).
//
// A site is a binding's body for one role, set of keyword arguments and batch loop,
// instantiated once. It has two parts:
// - `SiteCore`, everything a call needs but Python (its label, loop, the signatures its
//   check accepted, a kernel's keyword arguments); counted, so that a call in flight
//   keeps it alive, and read without the GIL by compiled bodies. It is alive while its
//   Site is: a Site that goes (or is retired) marks it dead, and a call that finds a dead
//   core finds its site again.
// - `Site`, a Python object (`_ext.Site`) made from the description Python gives (see
//   jaxbind/_runtime/sites.py, SiteDescription): the callable, its keyword arguments, the check.
//   The garbage collector sees everything it holds (site_traverse), so a cycle through
//   the user's callable and the op is collected like any other.
// A new buffer signature crosses into Python once, to `accept`.
#pragma once

#include <atomic>
#include <unordered_map>
#include <vector>

#include "call.h"
#include "cuda_kernels.h"
#include "kernels.h"
#include "process.h"

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

// A counted reference to a SiteCore (CoreRef) or an Instance (InstanceRef): anything
// with a `refs` count. Not std::shared_ptr: libstdc++'s reference counts read glibc's
// __libc_single_threaded (glibc 2.32), newer than the manylinux_2_28 wheel may need.
template <typename T>
class Counted {
 public:
  Counted() = default;
  explicit Counted(T *held) : held_(held) {
    if (held_) held_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  Counted(const Counted &other) : Counted(other.held_) {}
  Counted(Counted &&other) noexcept : held_(other.held_) { other.held_ = nullptr; }
  Counted &operator=(Counted other) noexcept {
    std::swap(held_, other.held_);
    return *this;
  }
  ~Counted() {
    if (held_ && held_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete held_;
  }
  T *get() const { return held_; }
  T &operator*() const { return *held_; }
  T *operator->() const { return held_; }
  explicit operator bool() const { return held_ != nullptr; }
  bool operator==(const Counted &other) const { return held_ == other.held_; }

 private:
  T *held_ = nullptr;
};
using CoreRef = Counted<SiteCore>;

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
  // From Python's description of the site (kept whole for the GPU plan maker).
  nb::object description, callable, kwargs_dump, label, accept;
  std::string binding;  // for error messages
  // The views of the site's last call, when the callable kept no reference to them:
  // the next call points them at its buffers instead of building new ones (views.h).
  nb::object out_views, in_views;
  GpuPlan gpu;  // the plan of the site's last GPU call (gpu.h)
  // Sites alive in the process, whoever owns them (programs, executables, the orphan
  // LRU): _ext.site_count. Counted by a member, so that a constructor that
  // throws counts nothing.
  static inline std::atomic<int64_t> alive{0};
  struct Counted {
    Counted() { alive.fetch_add(1, std::memory_order_relaxed); }
    Counted(const Counted &) : Counted() {}
    ~Counted() { alive.fetch_sub(1, std::memory_order_relaxed); }
  } counted;

  // Read the description: callable, kwargs_dump, label, binding, levels, batched, accept
  // and kernel (None, or what jaxbind/_kernels' KernelSite gives: batches, abi_version,
  // threads, kwargs and origin).
  explicit Site(nb::handle description) : core(new SiteCore()) {
    this->description = nb::borrow(description);
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
  ~Site() {
    if (core) core->die();
  }
  Site(const Site &) = delete;
  Site &operator=(const Site &) = delete;

  // A kernel's state (jaxbind/_kernels' KernelSite.state): None, or what the run time
  // made of it (jaxbind/_runtime/state.py's KernelState): its cell (an _ext.StateCell) for
  // a state without key, else the key inputs' positions and the lease that gives a cell
  // per key value; and whether the kernel's ranges run in order.
  void read_state(nb::handle state) {
    if (state.is_none()) return;
    KernelState &s = core->kernel.state;
    s.serial_tasks = nb::cast<bool>(state.attr("serial_tasks"));
    nb::object cell = state.attr("cell");
    if (!cell.is_none()) {
      s.cell = nb::cast<CellHandle &>(cell).cell;
      return;
    }
    s.keyed = std::make_unique<KeyedCells>(nb::cast<std::vector<int>>(state.attr("key_inputs")),
                                           state.attr("lease"), core->label);
  }
};

inline Site &site_of(nb::handle obj) { return *nb::inst_ptr<Site>(obj); }

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
  PyObject *site = nullptr;  // the Site: owned, or borrowed (valid while `core` is alive)
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
inline jaxbind_kernel_fn take_answer(Site &site, const Call &call, nb::handle answer) {
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

// The kernel's address for the call's signature (nullptr for a callable), after the
// site's check accepted it, in Python if it is new. Needs the GIL.
inline jaxbind_kernel_fn accept(Site &site, const Call &call) {
  jaxbind_kernel_fn fn = nullptr;
  SiteCore &core = *site.core.get();
  if (core.cuda ? core.cuda->find(call) != nullptr : accepted_before(core, call, fn)) return fn;
  return take_answer(site, call, site.accept(describe(call.ins), describe(call.outs)));
}

// The call's attributes for Python (jaxbind/_runtime/sites.py, instantiate_site), by their
// names in the program: those of the call's format that are there with the right type
// (Python says what is missing).
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

}  // namespace jaxbind
