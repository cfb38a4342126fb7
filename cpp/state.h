// jaxbind's trampoline: the state shared by its handlers (see jaxbind_ext.cc).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <nanobind/stl/vector.h>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "callformat.h"
#include "xla_ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

#ifndef JAXBIND_JAXLIB_VERSION
#define JAXBIND_JAXLIB_VERSION "unknown"
#endif

namespace jaxbind {

constexpr size_t kNumDtypes = 64;        // upper bound on XLA_FFI_DataType values
constexpr size_t kKnownSignatures = 32;  // per site: buffer shapes already validated (LRU)

// A counted reference to a compiled kernel's site (see kernels.h). Not std::shared_ptr:
// libstdc++'s reference counts read glibc's __libc_single_threaded (glibc 2.32), newer
// than the manylinux_2_28 wheel may need.
struct KernelSite;
inline void retain(KernelSite *site);
inline void release(KernelSite *site);

class KernelRef {
 public:
  KernelRef() = default;
  explicit KernelRef(KernelSite *site) : site_(site) {
    if (site_) retain(site_);
  }
  KernelRef(const KernelRef &other) : KernelRef(other.site_) {}
  KernelRef(KernelRef &&other) noexcept : site_(other.site_) { other.site_ = nullptr; }
  KernelRef &operator=(KernelRef other) noexcept {
    std::swap(site_, other.site_);
    return *this;
  }
  ~KernelRef() {
    if (site_) release(site_);
  }
  KernelSite *get() const { return site_; }
  KernelSite *operator->() const { return site_; }
  KernelSite &operator*() const { return *site_; }
  explicit operator bool() const { return site_ != nullptr; }
  bool operator==(const KernelRef &other) const { return site_ == other.site_; }

 private:
  KernelSite *site_ = nullptr;
};

// One call site: a binding's callable for one role and set of keyword
// arguments, resolved once. A Python object (`_ext.Site`), created by the
// resolver (jaxbind/_runtime.py) and owned by its binding; the trampoline's
// cache holds only a weak reference to it, and the garbage collector sees
// everything it holds (tp_traverse below), so a cycle through the user's
// callable and the op is collected like any other.
struct Site {
  nb::object callable;       // the user's Python callable
  nb::object kwargs_dump;    // decoded keyword arguments, passed through
  nb::object label;          // str naming the binding and role, for errors
  nb::object check;          // (inputs, outputs) -> None or an error message; see _runtime
  nb::object platform_mode;  // "device" or "host": how GPU calls reach the callable
  std::string binding;       // binding name, for error messages
  // jaxbind's own batching (see jaxbind/_rules/batching.py): the leading `levels` axes of every
  // output and of each input marked in `batched` are a batch; the callable is
  // called once per batch element. levels == 0: one plain call.
  int levels = 0;
  std::vector<bool> batched;
  // Buffer signatures (element types and dimensions of every input and output)
  // that `check` accepted: later calls with one of them need no Python check.
  std::vector<std::vector<int64_t>> known;
  // The views of the site's last call, when the callable kept no reference to
  // them: the next call points them at its buffers instead of building new ones.
  nb::object out_views, in_views;
  // A compiled kernel's site (see kernels.h), and (ins, outs) -> the kernel's address for
  // a buffer signature; empty for Python callables.
  KernelRef kernel;
  nb::object kernel_address;
};

// The cache entry of a site: the object itself (borrowed) and a weak reference
// whose callback removes the entry when the site is freed.
struct Entry {
  PyObject *site;
  nb::weakref ref;
};

struct State {
  std::unordered_map<int64_t, Entry> sites;          // digest -> site; accessed with the GIL held
  std::array<PyArray_Descr *, kNumDtypes> dtypes{};  // owned references
  nb::object resolver;                               // see _runtime.resolve_site; returns a Site
  nb::object formatter;                              // (label, type, value, traceback) -> str
  nb::object gpu_dispatch;                           // runs a GPU call; see _gpu.dispatch
  nb::object collect_garbage;  // drops JAX's lingering references to host arrays
  nb::object escaped;          // views that outlived their call; see _runtime.escaped_views
};

// Created by init() and deliberately never destroyed: XLA threads may still
// call in while the interpreter shuts down, and the objects held here must not
// be released after Python is gone.
inline State *state = nullptr;

// Set by jaxbind's atexit hook (see `shutdown` in jaxbind_ext.cc): from then on
// the interpreter is going away and no handler may touch Python. The limited
// C API of Python 3.12 has no Py_IsFinalizing, so the flag stands in for it.
inline std::atomic<bool> shutting_down{false};

// Handlers between their start and their return. At exit, `shutdown` waits for them
// (see jaxbind_ext.cc): a thread that the interpreter stops while it runs Python in a
// handler would unwind through XLA, which aborts the process.
inline std::atomic<int> in_flight{0};

struct InFlight {
  InFlight() { in_flight.fetch_add(1); }
  ~InFlight() { in_flight.fetch_sub(1); }
  InFlight(const InFlight &) = delete;
  InFlight &operator=(const InFlight &) = delete;
};

inline bool python_is_finalizing() {
  if (shutting_down.load() || !Py_IsInitialized()) return true;
#if defined(Py_LIMITED_API)
  return false;
#elif PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

inline ffi::Error error(ffi::ErrorCode code, std::string message) {
  return ffi::Error(code, "jaxbind: " + std::move(message));
}

}  // namespace jaxbind
