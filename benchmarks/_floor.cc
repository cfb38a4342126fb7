// The floor of any custom call that runs a Python callable: an XLA FFI handler
// that takes the GIL and calls the callable on NumPy arrays made beforehand,
// and does nothing else (no views of XLA's buffers, no lookups, no checks).
// It leaves XLA's output unwritten, so it is good for timing only.
//
// benchmarks/_cases.py compiles it on first use against the running jaxlib's
// FFI headers and Python's headers, and fills its slots through ctypes.

#include <Python.h>

#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {
std::vector<PyObject *> slots;  // (callable, outs, args, kwargs_dump) tuples, owned
}

extern "C" int floor_set(int64_t slot, PyObject *entry) {  // called with the GIL held
  if (slot < 0 || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 4) return -1;
  if (static_cast<size_t>(slot) >= slots.size()) slots.resize(slot + 1, nullptr);
  Py_INCREF(entry);
  Py_XDECREF(slots[slot]);
  slots[slot] = entry;
  return 0;
}

static ffi::Error Floor(ffi::RemainingArgs, ffi::RemainingRets, int64_t slot) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *entry = slots[slot];
  PyObject *argv[3] = {PyTuple_GET_ITEM(entry, 1), PyTuple_GET_ITEM(entry, 2),
                       PyTuple_GET_ITEM(entry, 3)};
  PyObject *result = PyObject_Vectorcall(PyTuple_GET_ITEM(entry, 0), argv, 3, nullptr);
  bool failed = result == nullptr;
  if (failed) PyErr_Print();
  Py_XDECREF(result);
  PyGILState_Release(gil);
  if (failed) return ffi::Error(ffi::ErrorCode::kInternal, "floor callable failed");
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    floor_handler, Floor, ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attr<int64_t>("slot"));
