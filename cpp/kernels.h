// jaxbind's trampoline and C runtime: compiled kernels (the C ABI of jaxbind/kernel.h),
// called without the GIL and without Python. A kernel site's calls run on the one
// described call (call.h); this file holds what only kernels need: their static keyword
// arguments in the ABI's form (read from Python's description by site.h, from a bundle's
// manifest by the C runtime), and the ABI call of one kernel on one (batch element of a)
// call.
#pragma once

#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "call.h"
#include "state.h"

namespace jaxbind {

// The ABI's structs are rows of 8-byte words, laid out as jaxbind/_kernels/abi.py's table
// says (which the kernel tests hold against the header's fields, in order).
static_assert(sizeof(jaxbind_buffer) == 4 * 8, "jaxbind_buffer is 4 words (abi.BUFFER)");
static_assert(sizeof(jaxbind_kwarg) == 10 * 8, "jaxbind_kwarg is 10 words (abi.KWARG)");
static_assert(sizeof(jaxbind_call) == 18 * 8, "jaxbind_call is 18 words (abi.CALL)");
static_assert(sizeof(jaxbind_setup) == 8 * 8, "jaxbind_setup is 8 words (abi.SETUP)");

// A kernel that failed: its message names the binding and the role already.
struct KernelError : LabelledError {
  using LabelledError::LabelledError;
};

// The static keyword arguments of a kernel site, owned here (names, strings and array
// data), as the ABI passes them (jaxbind_kwarg, sorted by name). Not copied: the ABI's
// structs point into it.
class KernelArgs {
 public:
  struct Array {
    int64_t dtype;
    std::vector<int64_t> dims;
    std::vector<char> data;
  };

  KernelArgs() = default;
  KernelArgs(const KernelArgs &) = delete;
  KernelArgs &operator=(const KernelArgs &) = delete;

  // One more argument, in name order (see jaxbind/_kernels/abi.py, typed_kwarg: its type
  // and values; a string's bytes, an array's dtype, dimensions and bytes, or none).
  void add(std::string name, int64_t type, int64_t int_value, double float_value,
           std::optional<std::string> string, std::optional<Array> array) {
    Owned &kept = owned_.emplace_back(Owned{std::move(name), std::move(string), std::move(array)});
    jaxbind_kwarg kw{};
    kw.name = kept.name.c_str();
    kw.type = type;
    kw.int_value = int_value;
    kw.float_value = float_value;
    if (kept.string) {
      kw.string = kept.string->c_str();
      kw.string_size = static_cast<int64_t>(kept.string->size());
    }
    if (kept.array)
      kw.array =
          jaxbind_buffer{kept.array->data.data(), kept.array->dtype,
                         static_cast<int64_t>(kept.array->dims.size()), kept.array->dims.data()};
    kwargs_.push_back(kw);
  }

  int64_t size() const { return static_cast<int64_t>(kwargs_.size()); }
  const jaxbind_kwarg *data() const { return kwargs_.data(); }

 private:
  struct Owned {
    std::string name;
    std::optional<std::string> string;
    std::optional<Array> array;
  };
  std::deque<Owned> owned_;  // (a deque never moves its elements: the structs point into them)
  std::vector<jaxbind_kwarg> kwargs_;
};

// What a kernel site's calls pass besides their buffers.
struct KernelSite {
  int64_t abi_version = JAXBIND_KERNEL_ABI_VERSION;  // the version it was registered for
  int64_t threads = 0;                               // at most this many (0: all XLA has)
  KernelArgs kwargs;
  std::string origin = "kernel";  // what it was made from, for messages ("ctypes function")
  KernelState state;              // the op's state (none: an op without state=)
  bool on_cuda = false;           // it runs in GPU programs (jaxbind.kernel(platform="cuda"))
};

// Call a kernel once on `call` (one batch element, or the whole call: then `loop` says
// which axes are the batch), at `place`, with `workers` for its parallel_for, and its op's object
// taken under the state's policy for the call (state.h). No GIL needed, no Python object
// made (but for a pool's new object, or a key value not seen). Throws KernelError with the kernel's
// message, prefixed with `label`, if it fails.
inline void call_kernel(jaxbind_kernel_fn fn, const KernelSite &site, const std::string &label,
                        const Call &call, const Loop *loop, const Workers &workers,
                        const Place &place = Place()) {
  StateUse state(site.state, call, place);  // the op's object, if it has a state
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
  abi.platform = place.platform;
  abi.stream = place.stream;
  abi.device = place.device;
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
