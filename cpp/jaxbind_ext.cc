// jaxbind's trampoline: the module (jaxbind._ext; its types, for type checkers:
// src/jaxbind/_ext.pyi). The handlers and everything they run live in the headers.
//
// Files, from the bottom up:
//   callformat.h  the attributes a call carries; its header (format, site digest)
//   floats.h      IEEE floating point (no flushed subnormals) while a body runs
//   workers.h     XLA's intra-op thread pool, as kernels and the batch loop use it
//   call.h        one described call: its buffers (decoded once), signature, batch loop
//   process.h     what the handlers share in the process: the Python functions called,
//                 the dtype table
//   boundary.h    the one error boundary (every failure -> one ffi::Error, one wording),
//                 and the one scope in which C++ calls Python
//   state.h       an op's state as kernels take it: its policy and objects' addresses
//                 (held.h, state_pool.h, state_cell.h, state_keys.h)
//   kernels.h     compiled kernels' keyword arguments, and the ABI call of a kernel
//   cuda_kernels.h  CUDA kernels: the driver loaded at run time, launches on XLA's stream
//   outputs.h     the opt-in check that a body wrote every element of its outputs
//   xla_slot.h    XLA's per-site slot, through the C API
//   site.h        what a call site is (its core, its Site) and the Instance a call finds
//   site_life.h   a site's life (instantiate, find, free): the one lookup, two doors to
//                 one Instance
//   views.h       NumPy views of host buffers, for Python callables
//   gpu.h         a site's GPU plan: made in Python once, pointed at each call's buffers
//   handlers.h    the CPU, CUDA, CUDA-kernel and instantiate handlers
//   this file     the module: the handlers' capsules, Site, StateCell, the process's
//                 settings, and what the tests reach
//
// A program does not name its body by address. A call's attributes (call format 4, see
// jaxbind/_callformat.py) carry the binding's stable name, the role, the encoded keyword
// arguments, jaxbind's batch loop and a 64-bit digest of them all. A site is made of
// them once (site_life.h), and each new buffer signature is checked in Python against
// the binding's abstract function (site.h). Then every call, on every platform,
// is the same: its buffers decoded once, jaxbind's loop checked once against them, and
// the body run once per batch element:
//   - a compiled kernel: without the GIL, and without Python once its signature is known;
//   - a Python callable on the CPU: the GIL taken, every input wrapped as a read-only NumPy
//     array and every output as a writable one (zero-copy), and
//         callable(out: tuple, args: tuple, kwargs_dump)
//     called;
//   - on CUDA: the site's GPU plan (jaxbind/_runtime/gpu.py), made in Python once per
//     stream, device and signature, its CudaArray views pointed at the element's device
//     buffers and the plan called (gpu.h); no CUDA header or library is needed here;
//   - a CUDA kernel: launched on XLA's stream from C++ (cuda_kernels.h), through its own
//     target, which XLA may capture into command buffers.
// Unknown names, bad programs and Python exceptions become ffi::Error values through the
// one boundary (boundary.h), never crashes.

#include "cuda_libraries.h"
#include "handlers.h"

#include <chrono>
#include <thread>

namespace jaxbind {

// The garbage collector's view of a Site: everything it holds that can lead
// back to user objects (nanobind's recipe for cyclic garbage collection).
int site_traverse(PyObject *self, visitproc visit, void *arg) {
#if PY_VERSION_HEX >= 0x03090000
  Py_VISIT(Py_TYPE(self));
#endif
  if (!nb::inst_ready(self)) return 0;
  Site &s = site_of(self);
  for (const nb::object *held : {&s.description, &s.callable, &s.kwargs_dump, &s.label, &s.accept,
                                 &s.gpu.plan, &s.gpu.views})
    Py_VISIT(held->ptr());
  return 0;
}

// What the collector breaks a cycle with: what site_traverse visits but `label` (a str:
// it leads nowhere, and messages still read it), and the last call's views besides (kept
// only when the callable kept none of them: arrays over XLA's buffers, holding nothing
// of the user's, so site_traverse has no need to visit them).
int site_clear(PyObject *self) {
  Site &s = site_of(self);
  for (nb::object *held : {&s.description, &s.callable, &s.kwargs_dump, &s.accept}) held->reset();
  s.out_views.reset();
  s.in_views.reset();
  s.gpu = GpuPlan();
  return 0;
}

// Buffers as Python describes them, (address, shape, XLA element type), into a frame's
// call: as the GPU plan maker gets them.
struct DescribedCall {
  Frame frame;
  std::vector<std::vector<int64_t>> dims;  // (moving an inner vector keeps its data)

  DescribedCall(nb::handle ins, nb::handle outs) {
    read(ins, frame.call.ins);
    read(outs, frame.call.outs);
  }
  void read(nb::handle items, std::vector<Buffer> &out) {
    for (nb::handle item : items) {
      nb::tuple t = nb::cast<nb::tuple>(item);
      dims.push_back(nb::cast<std::vector<int64_t>>(t[1]));
      out.push_back(Buffer{reinterpret_cast<void *>(nb::cast<uintptr_t>(t[0])),
                           nb::cast<int64_t>(t[2]), static_cast<int64_t>(dims.back().size()),
                           dims.back().data()});
    }
  }
};

// Each platform's handlers, {stage: PyCapsule}, for jax.ffi.register_ffi_target.
struct Target {
  const char *function;
  void *instantiate, *execute;  // (no instantiate: the handler keeps no slot in XLA)
  const char *doc;
};
const Target kTargets[] = {
    {"cpu_handlers", reinterpret_cast<void *>(jaxbind_cpu_instantiate),
     reinterpret_cast<void *>(jaxbind_cpu_handler),
     "The CPU FFI handlers, {stage: PyCapsule}, for jax.ffi.register_ffi_target."},
    {"cuda_handlers", reinterpret_cast<void *>(jaxbind_cuda_instantiate),
     reinterpret_cast<void *>(jaxbind_cuda_handler),
     "The CUDA FFI handlers, {stage: PyCapsule} (built without the CUDA toolkit)."},
    {"cuda_kernel_handlers", nullptr, reinterpret_cast<void *>(jaxbind_cuda_kernel_handler),
     "The FFI handler of calls of CUDA kernels, {stage: PyCapsule}: no instantiate stage "
     "(no slot kept in XLA), compatible with command buffers."},
};

// Numbers the module reports, each read by a function without arguments.
struct Reading {
  const char *function;
  int64_t (*read)();
  const char *doc;
};
const Reading kReadings[] = {
    {"cuda_kernel_launches", [] { return cuda_launches.load(); },
     "How many CUDA kernel launches jaxbind's handlers made in this process (a program XLA "
     "replays from a CUDA graph makes none)."},
    {"python_entries", [] { return python_entries.load(); },
     "How many calls jaxbind's handlers ran with Python (the GIL taken: a Python body, a "
     "site's first call, a signature not seen) in this process; compiled bodies' other "
     "calls come without it."},
    {"stream_kernel_calls", [] { return stream_kernel_calls.load(); },
     "How many calls of kernels for CUDA (jaxbind.kernel(platform=\"cuda\")) jaxbind's "
     "handlers made in this process, one per batch element."},
    {"kernel_abi_version", [] { return static_cast<int64_t>(JAXBIND_KERNEL_ABI_VERSION); },
     "The version of the kernel ABI (jaxbind/kernel.h) this build calls."},
    {"site_count", [] { return Site::alive.load(std::memory_order_relaxed); },
     "Number of call sites alive (owned by programs, executables or the orphan LRU)."},
};

void define_site(nb::module_ &m) {
  static PyType_Slot site_slots[] = {{Py_tp_traverse, reinterpret_cast<void *>(site_traverse)},
                                     {Py_tp_clear, reinterpret_cast<void *>(site_clear)},
                                     {0, nullptr}};
  nb::class_<Site>(m, "Site", nb::type_slots(site_slots), nb::is_weak_referenceable(),
                   "One call site (made by jaxbind._runtime.sites.instantiate_site).")
      .def(
          "__init__", [](Site *self, nb::handle description) { new (self) Site(description); },
          nb::arg("description"),
          "From Python's description of the site (jaxbind._runtime.sites.SiteDescription).")
      .def_prop_ro("binding", [](const Site &s) { return s.binding; })
      .def_prop_ro("levels", [](const Site &s) { return s.core->loop.levels; })
      .def_prop_ro("accepted_signatures",
                   [](const Site &s) {
                     return s.core->cuda ? s.core->cuda->accepted_count() : s.core->accepted.size();
                   })
      .def_prop_ro("is_kernel", [](const Site &s) { return s.core->is_kernel; })
      .def(
          "retire", [](Site &s) { s.core->die(); },
          "Stop calls from using this site (its binding was defined again): the executables "
          "that hold it instantiate their site again at their next call.")
      .def_prop_ro(
          "routes", [](const Site &s) { return door_names(*s.core); },
          "The doors through which calls found this site's instance (cpp/site_life.h).");
}

void define_state_cell(nb::module_ &m) {
  nb::list policies;
  for (const char *name : kPolicies) policies.append(name);
  m.attr("state_policies") = nb::tuple(policies);
  m.attr("state_keys_kept") = KeyedCells::kKeys;
  nb::exception<ReentrantUse>(m, "ReentrantUse", PyExc_RuntimeError);
  nb::class_<CellHandle>(
      m, "StateCell",
      "The concurrency of one state's objects, as kernels and Python bodies "
      "take them (see cpp/state.h; made by jaxbind._runtime.state.StateObjects).")
      .def(
          "__init__",
          [](CellHandle *self, const std::string &policy, int size, nb::handle owner,
             std::string label, std::string state) {
            new (self) CellHandle(policy, size, owner, std::move(label), std::move(state));
          },
          nb::arg("policy"), nb::arg("size"), nb::arg("owner"), nb::arg("label"),
          nb::arg("state") = "",
          "policy: one of state_policies; size: a pool's objects at most; owner: the "
          "state, whose provide(slot, make) gives a slot's address (held weakly); label and "
          "state (the setup's name) for messages.")
      .def(
          "acquire",
          [](CellHandle &h) {
            auto [slot, made_here] = h.acquire();
            return made_here ? -1 - slot : slot;
          },
          "The slot of an object for one call, taken under the policy (waits without the "
          "GIL, never for an object this thread holds: RuntimeError then); -1 - slot for a "
          "slot whose object the caller makes (or abandons).")
      .def(
          "release", [](CellHandle &h, int slot) { h.cell->release(slot); }, nb::arg("slot"))
      .def(
          "abandon", [](CellHandle &h, int slot) { h.cell->abandon(slot); }, nb::arg("slot"))
      .def(
          "set_address",
          [](CellHandle &h, int slot, uintptr_t address) { h.cell->set_address(slot, address); },
          nb::arg("slot"), nb::arg("address"))
      .def(
          "close", [](CellHandle &h) { h.close(); },
          "Wait for the calls using an object, and refuse later ones: then the objects may "
          "be torn down.")
      .def_prop_ro("closed", [](CellHandle &h) { return h.cell->closed(); });
}

// What Python sets in the process: the functions the trampoline calls, the dtype table,
// the output check, and the exit hook.
void define_process(nb::module_ &m) {
  m.def(
      "set_gpu_plan",
      [](nb::object make) {
        if (process == nullptr) process = new Process();
        process->gpu_plan = make;
      },
      nb::arg("make"),
      "Set the Python function that makes a site's GPU plan: (description, stream, device, "
      "inputs, outputs), each buffer as (address, shape, element type) -> a plan with "
      "`views` (each with a settable `ptr`) that runs the call when called.");

  m.def(
      "init",
      [](nb::dict dtypes, nb::object instantiate, nb::object formatter, nb::object gpu_plan) {
        if (process == nullptr) process = new Process();
        for (auto [key, value] : dtypes) {
          auto code = nb::cast<size_t>(key);
          if (code >= kNumDtypes) throw nb::value_error("XLA element type out of range");
          PyArray_Descr *descr = nullptr;
          if (!PyArray_DescrConverter(value.ptr(), &descr)) throw nb::python_error();
          Py_XDECREF(reinterpret_cast<PyObject *>(process->dtypes[code]));
          process->dtypes[code] = descr;
        }
        process->instantiate = instantiate;
        process->formatter = formatter;
        process->gpu_plan = gpu_plan;
      },
      nb::arg("dtypes"), nb::arg("instantiate"), nb::arg("formatter"), nb::arg("gpu_plan"),
      "Set the dtype table {XLA element type: numpy dtype}, the site maker (a call's "
      "attributes -> (Site, owned)), the error formatter and the GPU plan maker (see "
      "jaxbind/_runtime/__init__.py).");

  m.def(
      "set_view_hooks",
      [](nb::object collect_garbage, nb::object escaped) {
        if (process == nullptr) process = new Process();
        process->collect_garbage = collect_garbage;
        process->escaped = escaped;
      },
      nb::arg("collect_garbage"), nb::arg("escaped"),
      "Set what runs when a callable kept a view: collect_garbage() drops JAX's lingering "
      "references; escaped(label, [(address, nbytes, view, holders)], outs, ins) is told "
      "the views that were given their own copies.");

  m.def(
      "shutdown",
      [](double timeout_s) {
        shutting_down.store(true);
        // Let handlers already running finish their Python work while the interpreter
        // still runs: stopped later, their threads would unwind through XLA and abort.
        nb::gil_scoped_release release;
        auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
        while (in_flight.load() > 0 && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        // ... and give their threads a moment to get back from XLA into Python: a thread
        // stopped inside JAX's own dispatch aborts too (jaxlib's frames, not ours).
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      },
      nb::arg("timeout_s") = 10.0,
      "Called at interpreter exit: from then on handlers return an error instead of "
      "calling Python; waits (up to timeout_s) for the handlers already running.");
  m.def(
      "set_check_outputs", [](bool on) { return check_outputs.exchange(on); }, nb::arg("on"),
      "Check that bodies of CPU calls write every element of their outputs (see "
      "cpp/outputs.h), or stop; returns the setting before.");
}

// Arrays over memory jaxbind does not own, and the kernel ABI's parallel_for.
void define_memory(nb::module_ &m) {
  m.def(
      "dlpack_view",
      [](uintptr_t pointer, std::vector<size_t> shape, uint8_t code, uint8_t bits,
         int32_t device_type, int32_t device_id, nb::handle owner) {
        nb::dlpack::dtype dtype{code, bits, 1};
        nb::ndarray<> view(reinterpret_cast<void *>(pointer), shape.size(), shape.data(), owner,
                           nullptr, dtype, device_type, device_id);
        return nb::cast(view);
      },
      nb::arg("pointer"), nb::arg("shape"), nb::arg("code"), nb::arg("bits"),
      nb::arg("device_type"), nb::arg("device_id"), nb::arg("owner"),
      "A zero-copy DLPack-capable array over memory jaxbind does not own (`owner` keeps "
      "whatever must outlive it alive).");
  m.def(
      "move_view",
      [](nb::handle obj, uintptr_t old_start, int64_t nbytes, uintptr_t new_start) {
        if (!PyArray_Check(obj.ptr())) throw nb::type_error("not a NumPy array");
        auto *fields = reinterpret_cast<PyArrayObject_fields *>(obj.ptr());
        auto at = reinterpret_cast<uintptr_t>(fields->data);
        if (at < old_start || at >= old_start + static_cast<uintptr_t>(nbytes)) return false;
        fields->data = reinterpret_cast<char *>(new_start + (at - old_start));
        PyArray_CLEARFLAGS(reinterpret_cast<PyArrayObject *>(obj.ptr()), NPY_ARRAY_WRITEABLE);
        return true;
      },
      nb::arg("array"), nb::arg("old_start"), nb::arg("nbytes"), nb::arg("new_start"),
      "Point an array derived from a view (a slice, a reshape) that pointed into "
      "[old_start, old_start + nbytes) at the same place in the view's copy, read-only.");
  m.def(
      "parallel_for_address", []() { return reinterpret_cast<uintptr_t>(&parallel_for); },
      "The address of the kernel ABI's parallel_for, for kernels called from Python "
      "(jaxbind/_kernels/abi.py): with no workers, it runs the tasks in order.");
}

// The kernels and C states of jaxbind.contrib.cuda (cuda_libraries.h), as addresses.
void define_cuda_libraries(nb::module_ &m) {
  auto at = [](auto fn) { return reinterpret_cast<uintptr_t>(fn); };
  m.def(
      "cuda_library_entry_points",
      [at]() {
        namespace cl = cuda_libraries;
        nb::dict found;
        found["cufft"] =
            nb::make_tuple(at(cl::cufft::setup), at(cl::cufft::teardown), at(cl::cufft::execute));
        found["cufinufft"] = nb::make_tuple(at(cl::cufinufft::setup), at(cl::cufinufft::teardown),
                                            at(cl::cufinufft::type1), at(cl::cufinufft::type2));
        return found;
      },
      "{library: (setup, teardown, kernel, ...)}: the addresses of the C states and kernels "
      "for CUDA that call CUDA libraries' plan-based APIs (jaxbind.contrib.cuda).");
}

// What the tests reach of the CUDA handler without a GPU: its body, on host memory.
void define_gpu_tests(nb::module_ &m) {
  m.def(
      "gpu_call_for_tests",
      [](Site &site, uintptr_t stream, int32_t device, nb::handle ins, nb::handle outs) {
        DescribedCall described(ins, outs);
        try {
          jaxbind_kernel_fn fn =
              site.core->is_kernel ? accept(site, described.frame.call) : nullptr;
          run_gpu(site, described.frame, stream, device, fn);
        } catch (std::invalid_argument &e) {
          throw nb::value_error(e.what());
        }
      },
      nb::arg("site"), nb::arg("stream"), nb::arg("device"), nb::arg("inputs"), nb::arg("outputs"),
      "Run the CUDA handler's body for `site` on buffers given as (address, shape, XLA "
      "element type): its batch loop and the site's GPU plan, or its kernel for CUDA (its "
      "signature checked first), without a GPU (host memory stands in for device memory), "
      "for tests.");
  m.def(
      "gpu_error_for_tests",
      [](Site &site, uintptr_t stream, int32_t device, nb::handle ins,
         nb::handle outs) -> nb::object {
        DescribedCall described(ins, outs);
        ffi::Error error = gpu_work_for_tests(site, described.frame, stream, device);
        if (error.success()) return nb::none();
        return nb::make_tuple(static_cast<int>(*error.errc()), error.message());
      },
      nb::arg("site"), nb::arg("stream"), nb::arg("device"), nb::arg("inputs"), nb::arg("outputs"),
      "As gpu_call_for_tests, with the signature accepted first and inside the handlers' "
      "error boundary: None, or the (XLA error code, message) the CUDA handler would "
      "return.");
}

}  // namespace jaxbind

using namespace jaxbind;

NB_MODULE(_ext, m) {
  if (_import_array() < 0) throw nb::python_error();
  // Sites of bindings that live until exit (module-level ops) are still alive when
  // the interpreter shuts down, on purpose (see Process): not leaks worth reporting.
  nb::set_leak_warnings(false);

  m.attr("call_format") = kCallFormat;
  m.attr("jaxlib_version") = JAXBIND_JAXLIB_VERSION;
  m.attr("ffi_api_version") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);

  xla_slot::deleter = free_instance;
  for (const Target &t : kTargets)
    m.def(
        t.function,
        [t]() {
          nb::dict handlers;
          if (t.instantiate != nullptr) handlers["instantiate"] = nb::capsule(t.instantiate);
          handlers["execute"] = nb::capsule(t.execute);
          return handlers;
        },
        t.doc);
  for (const Reading &r : kReadings) m.def(r.function, r.read, r.doc);

  define_site(m);
  define_state_cell(m);

  define_process(m);
  define_memory(m);
  define_gpu_tests(m);
  define_cuda_libraries(m);
}
