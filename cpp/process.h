// jaxbind's trampoline: what its handlers share in the process (see jaxbind_ext.cc):
// the Python functions it calls, the dtype table, and the interpreter's shutdown.
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

constexpr size_t kNumDtypes = 64;  // upper bound on XLA_FFI_DataType values

struct Process {
  std::array<PyArray_Descr *, kNumDtypes> dtypes{};  // owned references
  nb::object instantiate;      // (attributes) -> (Site, owned): a call's site (site_life.h)
  nb::object formatter;        // (label, type, value, traceback) -> str
  nb::object gpu_plan;         // (description, stream, device, inputs, outputs) -> a GPU plan
  nb::object collect_garbage;  // drops JAX's lingering references to host arrays
  nb::object escaped;          // views that outlived their call; see _runtime/report.py
};

// Created by init() and deliberately never destroyed: XLA threads may still
// call in while the interpreter shuts down, and the objects held here must not
// be released after Python is gone.
inline Process *process = nullptr;

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

// Python may be called (the module is initialised and the interpreter not going away).
inline bool python_is_usable() { return process != nullptr && !python_is_finalizing(); }

inline ffi::Error error(ffi::ErrorCode code, std::string message) {
  return ffi::Error(code, "jaxbind: " + std::move(message));
}

}  // namespace jaxbind
