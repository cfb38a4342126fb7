// jaxbind's trampoline: compiled kernels (the C ABI of jaxbind/kernel.h), called without
// the GIL. A kernel site's calls run on the one described call (call.h); this file holds
// what only kernels need: their static keyword arguments in the ABI's form, and the ABI
// call of one kernel on one (batch element of a) call.
#pragma once

#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "call.h"
#include "state.h"

namespace jaxbind {

namespace nb = nanobind;

// The ABI's structs are rows of 8-byte words, laid out as jaxbind/_kernels/abi.py's table
// says (which the kernel tests hold against the header's fields, in order).
static_assert(sizeof(jaxbind_buffer) == 4 * 8, "jaxbind_buffer is 4 words (abi.BUFFER)");
static_assert(sizeof(jaxbind_kwarg) == 10 * 8, "jaxbind_kwarg is 10 words (abi.KWARG)");
static_assert(sizeof(jaxbind_call) == 15 * 8, "jaxbind_call is 15 words (abi.CALL)");

// A kernel that failed: its message names the binding and the role already.
struct KernelError : LabelledError {
  using LabelledError::LabelledError;
};

// The static keyword arguments of a kernel site, owned here (names, strings and array
// data), as the ABI passes them (jaxbind_kwarg, sorted by name).
class KernelArgs {
 public:
  // From the site's description (see jaxbind/_kernels/abi.py, KernelSite.kwargs): one
  // tuple per argument, (name, type, int value, float value, bytes or None,
  // (dtype, dims, bytes) or None). Needs the GIL.
  void read(nb::handle items) {
    size_t n = nb::len(items);
    names_.reserve(n);  // (the ABI's structs point into these: no reallocation)
    strings_.reserve(n);
    array_data_.reserve(n);
    array_dims_.reserve(n);
    for (nb::handle item : items) {
      nb::tuple t = nb::cast<nb::tuple>(item);
      jaxbind_kwarg kw{};
      names_.push_back(nb::cast<std::string>(t[0]));
      kw.name = names_.back().c_str();
      kw.type = nb::cast<int64_t>(t[1]);
      kw.int_value = nb::cast<int64_t>(t[2]);
      kw.float_value = nb::cast<double>(t[3]);
      if (!t[4].is_none()) {
        nb::bytes text = nb::cast<nb::bytes>(t[4]);
        strings_.emplace_back(text.c_str(), text.size());
        kw.string = strings_.back().c_str();
        kw.string_size = static_cast<int64_t>(strings_.back().size());
      }
      if (!t[5].is_none()) {
        nb::tuple a = nb::cast<nb::tuple>(t[5]);
        array_dims_.push_back(nb::cast<std::vector<int64_t>>(a[1]));
        nb::bytes data = nb::cast<nb::bytes>(a[2]);
        array_data_.emplace_back(data.c_str(), data.c_str() + data.size());
        kw.array = jaxbind_buffer{array_data_.back().data(), nb::cast<int64_t>(a[0]),
                                  static_cast<int64_t>(array_dims_.back().size()),
                                  array_dims_.back().data()};
      }
      kwargs_.push_back(kw);
    }
  }

  int64_t size() const { return static_cast<int64_t>(kwargs_.size()); }
  const jaxbind_kwarg *data() const { return kwargs_.data(); }

 private:
  std::vector<std::string> names_, strings_;
  std::vector<std::vector<char>> array_data_;
  std::vector<std::vector<int64_t>> array_dims_;
  std::vector<jaxbind_kwarg> kwargs_;
};

// What a kernel site's calls pass besides their buffers.
struct KernelSite {
  int64_t abi_version = JAXBIND_KERNEL_ABI_VERSION;  // the version it was registered for
  int64_t threads = 0;                               // at most this many (0: all XLA has)
  KernelArgs kwargs;
  std::string origin = "kernel";  // what it was made from, for messages ("ctypes function")
  KernelState state;              // the op's state (none: an op without state=)
};

// Call a kernel once on `call` (one batch element, or the whole call: then `loop` says
// which axes are the batch), with `workers` for its parallel_for, and its op's object
// taken under the state's policy for the call (state.h). No GIL needed, no Python object
// made (but for a pool's new object, or a key value not seen). Throws KernelError with the kernel's
// message, prefixed with `label`, if it fails.
inline void call_kernel(jaxbind_kernel_fn fn, const KernelSite &site, const std::string &label,
                        const Call &call, const Loop *loop, const Workers &workers) {
  StateUse state(site.state, call);  // the op's object for this call, if it has a state
  const Workers &tasks = site.state.serial_tasks ? serial_workers : workers;
  const KernelArgs &kwargs = site.kwargs;
  char message[1024];
  message[0] = '\0';
  jaxbind_call abi{};
  abi.abi_version = site.abi_version;
  abi.n_inputs = static_cast<int64_t>(call.ins.size());
  abi.inputs = call.ins.data();
  abi.n_outputs = static_cast<int64_t>(call.outs.size());
  abi.outputs = call.outs.data();
  abi.n_kwargs = kwargs.size();
  abi.kwargs = kwargs.data();
  abi.batch_levels = loop != nullptr ? loop->levels : 0;
  abi.batched = loop != nullptr ? loop->batched.data() : nullptr;
  abi.error = message;
  abi.error_size = sizeof(message);
  abi.n_threads = tasks.threads();  // (asked here, before any task runs)
  abi.parallel_for = parallel_for;
  abi.workers = const_cast<Workers *>(&tasks);
  abi.state = state.address();
  int32_t status = fn(&abi);
  if (status == 0) return;
  message[sizeof(message) - 1] = '\0';
  // (jaxbind's numba wrappers always write a message: see jaxbind/_kernels/numba_codegen.py)
  std::string why = message[0] != '\0'
                        ? std::string(message)
                        : "the " + site.origin + " returned status " + std::to_string(status) +
                              " without writing a message into call->error";
  throw KernelError("kernel of " + label + " failed: " + why);
}

}  // namespace jaxbind
