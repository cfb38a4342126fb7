// jaxbind's trampoline: a call site's Python half (its core and the Instance a call finds
// it through: site_core.h; its life, from instantiate to free: site_life.h).
//
// A site is a binding's body for one role, set of keyword arguments and batch loop,
// instantiated once. It has two parts:
// - `SiteCore` (site_core.h), everything a call needs but Python, read without the GIL
//   by compiled bodies. It is alive while its Site is: a Site that goes (or is retired)
//   marks it dead, and a call that finds a dead core finds its site again.
// - `Site`, a Python object (`_ext.Site`) made from the description Python gives (see
//   jaxbind/_runtime/sites.py, SiteDescription): the callable, its keyword arguments, the check.
//   The garbage collector sees everything it holds (site_traverse), so a cycle through
//   the user's callable and the op is collected like any other.
// A new buffer signature crosses into Python once, to `accept`.
#pragma once

#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "call.h"
#include "cuda_kernels.h"
#include "kernels.h"
#include "process.h"
#include "site_core.h"
#include "state_keys.h"
#include "state_python.h"

namespace jaxbind {

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
      read_kwargs(kernel.attr("kwargs"));
      core->kernel.origin = nb::cast<std::string>(kernel.attr("origin"));
      core->kernel.on_cuda = nb::cast<std::string>(kernel.attr("platform")) == "cuda";
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

  // A kernel's static keyword arguments (see jaxbind/_kernels/abi.py, KernelSite.kwargs):
  // one tuple per argument, (name, type, int value, float value, bytes or None,
  // (dtype, dims, bytes) or None).
  void read_kwargs(nb::handle items) {
    for (nb::handle item : items) {
      nb::tuple t = nb::cast<nb::tuple>(item);
      std::optional<std::string> string;
      std::optional<KernelArgs::Array> array;
      if (!t[4].is_none()) {
        nb::bytes text = nb::cast<nb::bytes>(t[4]);
        string.emplace(text.c_str(), text.size());
      }
      if (!t[5].is_none()) {
        nb::tuple a = nb::cast<nb::tuple>(t[5]);
        nb::bytes data = nb::cast<nb::bytes>(a[2]);
        array = KernelArgs::Array{nb::cast<int64_t>(a[0]), nb::cast<std::vector<int64_t>>(a[1]),
                                  std::vector<char>(data.c_str(), data.c_str() + data.size())};
      }
      core->kernel.kwargs.add(nb::cast<std::string>(t[0]), nb::cast<int64_t>(t[1]),
                              nb::cast<int64_t>(t[2]), nb::cast<double>(t[3]), std::move(string),
                              std::move(array));
    }
  }

  // A kernel's state (jaxbind/_kernels' KernelSite.state): None, or what the run time
  // made of it (jaxbind/_runtime/state.py's KernelState): its cell (an _ext.StateCell) for
  // a state without key, else the key inputs' positions and the lease that gives a cell
  // per key value, or (a CUDA kernel's) the lease that gives a cell per device; and
  // whether the kernel's ranges run in order.
  void read_state(nb::handle state) {
    if (state.is_none()) return;
    KernelState &s = core->kernel.state;
    s.serial_tasks = nb::cast<bool>(state.attr("serial_tasks"));
    nb::object cell = state.attr("cell");
    if (!cell.is_none()) {
      s.cell = nb::cast<CellHandle &>(cell).cell;
      return;
    }
    if (nb::cast<bool>(state.attr("per_device"))) {
      s.finder = std::make_unique<DeviceCells>(state.attr("lease"), core->label);
      return;
    }
    s.finder = std::make_unique<KeyedCells>(nb::cast<std::vector<int>>(state.attr("key_inputs")),
                                            state.attr("lease"), core->label);
  }
};

// A site's launch from what the site's check gives for a signature (jaxbind/_kernels/
// cuda.py, CudaKernelSite.launch): (grid, block, shared memory bytes, (scalar bytes, ...)).
inline Launch read_launch(nb::handle answer) {
  nb::tuple t = nb::cast<nb::tuple>(answer);
  Launch launch;
  auto dims = [](nb::handle value, std::array<unsigned, 3> &out) {
    nb::tuple d = nb::cast<nb::tuple>(value);
    for (size_t i = 0; i < 3; ++i) out[i] = nb::cast<unsigned>(d[i]);
  };
  dims(t[0], launch.grid);
  dims(t[1], launch.block);
  launch.shared = nb::cast<unsigned>(t[2]);
  for (nb::handle value : nb::cast<nb::tuple>(t[3])) {
    nb::bytes bytes = nb::cast<nb::bytes>(value);
    std::vector<uint64_t> words((bytes.size() + 7) / 8, 0);
    std::memcpy(words.data(), bytes.c_str(), bytes.size());
    launch.scalars.push_back(std::move(words));
  }
  return launch;
}

inline Site &site_of(nb::handle obj) { return *nb::inst_ptr<Site>(obj); }

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
