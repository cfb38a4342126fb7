// jaxbind's trampoline: compiled kernels (the C ABI of jaxbind/kernel.h), called without
// the GIL.
//
// A site whose body is a kernel has a KernelSite beside its Python Site. The handler
// looks it up by the call's digest in `kernel_sites` before it takes the GIL; for a
// buffer signature the site has already checked, it calls the kernel (once per batch
// element, or once for a batching kernel) without creating any Python object. A new
// signature goes through the GIL path once: the Site's check against the abstract
// function, and the kernel's address for that signature (numba kernels are compiled
// per signature). The table holds shared pointers, so a call in flight keeps its
// KernelSite alive when its Site goes.
#pragma once

#include <mutex>
#include <shared_mutex>

#include "jaxbind/kernel.h"
#include "state.h"

namespace jaxbind {

struct KernelSite {
  bool batches = false;  // the kernel takes the whole batch (batch_levels in the call)
  int levels = 0;
  std::vector<uint8_t> batched;
  std::string label;  // "'<binding>' (<role>)", for errors
  // The static keyword arguments, owned here: names, strings and array data.
  std::vector<std::string> names, strings;
  std::vector<std::vector<char>> array_data;
  std::vector<std::vector<int64_t>> array_dims;
  std::vector<jaxbind_kwarg> kwargs;
  // Buffer signatures already checked, each with the kernel's address for it.
  std::shared_mutex mu;
  std::vector<std::pair<std::vector<int64_t>, jaxbind_kernel_fn>> known;

  jaxbind_kernel_fn find(const std::vector<int64_t> &signature) {
    std::shared_lock lock(mu);
    for (auto &[sig, fn] : known)
      if (sig == signature) return fn;
    return nullptr;
  }
  void add(std::vector<int64_t> signature, jaxbind_kernel_fn fn) {
    std::unique_lock lock(mu);
    if (known.size() >= kKnownSignatures) known.erase(known.begin());
    known.emplace_back(std::move(signature), fn);
  }
};

// A kernel that failed: its message names the binding and the role already.
struct KernelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The KernelSite of a kernel body, from the resolver's description of it (see
// jaxbind/_kernels.py, KernelCall): `batches`, and `kwargs`, one tuple per static keyword
// argument (name, type, int value, float value, bytes or None, (dtype, dims, bytes) or None).
inline std::shared_ptr<KernelSite> make_kernel_site(nb::handle kernel, std::string label,
                                                    int levels, const std::vector<bool> &batched) {
  auto ks = std::make_shared<KernelSite>();
  ks->batches = nb::cast<bool>(kernel.attr("batches"));
  ks->levels = levels;
  ks->batched.assign(batched.begin(), batched.end());
  ks->label = std::move(label);
  nb::list items = nb::cast<nb::list>(kernel.attr("kwargs"));
  size_t n = nb::len(items);
  ks->names.reserve(n);
  ks->strings.reserve(n);
  ks->array_data.reserve(n);
  ks->array_dims.reserve(n);
  for (nb::handle item : items) {
    nb::tuple t = nb::cast<nb::tuple>(item);
    jaxbind_kwarg kw{};
    ks->names.push_back(nb::cast<std::string>(t[0]));
    kw.name = ks->names.back().c_str();
    kw.type = nb::cast<int64_t>(t[1]);
    kw.int_value = nb::cast<int64_t>(t[2]);
    kw.float_value = nb::cast<double>(t[3]);
    if (!t[4].is_none()) {
      nb::bytes text = nb::cast<nb::bytes>(t[4]);
      ks->strings.emplace_back(text.c_str(), text.size());
      kw.string = ks->strings.back().c_str();
      kw.string_size = static_cast<int64_t>(ks->strings.back().size());
    }
    if (!t[5].is_none()) {
      nb::tuple a = nb::cast<nb::tuple>(t[5]);
      ks->array_dims.push_back(nb::cast<std::vector<int64_t>>(a[1]));
      nb::bytes data = nb::cast<nb::bytes>(a[2]);
      ks->array_data.emplace_back(data.c_str(), data.c_str() + data.size());
      kw.array = jaxbind_buffer{ks->array_data.back().data(), nb::cast<int64_t>(a[0]),
                                static_cast<int64_t>(ks->array_dims.back().size()),
                                ks->array_dims.back().data()};
    }
    ks->kwargs.push_back(kw);
  }
  return ks;
}

// digest -> kernel site, for calls that run without the GIL.
inline std::shared_mutex kernel_mu;
inline std::unordered_map<int64_t, std::shared_ptr<KernelSite>> kernel_sites;

inline std::shared_ptr<KernelSite> find_kernel_site(int64_t digest) {
  std::shared_lock lock(kernel_mu);
  auto it = kernel_sites.find(digest);
  return it == kernel_sites.end() ? nullptr : it->second;
}

// The buffer signature of a call: element type, rank and dimensions of every input, then
// every output (the same form as a Site's `known`).
template <typename Remaining>
void signature_of(const Remaining &buffers, std::vector<int64_t> &sig, const char *what) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    ffi::AnyBuffer b = buffer_at(buffers, i, what);
    auto dims = b.dimensions();
    sig.push_back(static_cast<int64_t>(b.element_type()));
    sig.push_back(static_cast<int64_t>(dims.size()));
    sig.insert(sig.end(), dims.begin(), dims.end());
  }
}

// Describe buffers i of a call (element k of jaxbind's loop) in the ABI's form.
template <typename Remaining>
void describe_kernel_buffers(const Remaining &buffers, const char *what, int levels, int64_t k,
                             const uint8_t *batched, std::vector<jaxbind_buffer> &out) {
  out.resize(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    View v = view_of(buffers, i, what, levels, k, batched == nullptr || batched[i]);
    out[i] = jaxbind_buffer{v.data, static_cast<int64_t>(v.type),
                            static_cast<int64_t>(v.dims.size()), v.dims.begin()};
  }
}

// Number of batch elements, after checking that every output and each batched input
// leads with the same `levels` axes (nothing in a program may make the loop step
// outside a buffer).
inline int64_t kernel_batch_size(const KernelSite &ks, const Args &args, const Rets &rets) {
  if (ks.batched.size() != args.size())
    throw std::invalid_argument("the call's batch flags name " + std::to_string(ks.batched.size()) +
                                " inputs, but it has " + std::to_string(args.size()));
  if (rets.size() == 0) throw std::invalid_argument("a batched call needs an output");
  std::vector<int64_t> batch = leading_axes(rets, 0, ks.levels, "output");
  for (size_t i = 1; i < rets.size(); ++i)
    if (leading_axes(rets, i, ks.levels, "output") != batch)
      throw std::invalid_argument("output " + std::to_string(i) +
                                  " does not lead with the batch axes of output 0");
  for (size_t i = 0; i < args.size(); ++i)
    if (ks.batched[i] && leading_axes(args, i, ks.levels, "input") != batch)
      throw std::invalid_argument("input " + std::to_string(i) +
                                  " does not lead with the batch axes of output 0");
  int64_t n = 1;
  for (int64_t d : batch) n *= d;
  return n;
}

// Run a kernel on a call's buffers: no GIL needed, no Python object made. Throws
// std::runtime_error with the kernel's message if it fails.
inline void run_kernel(KernelSite &ks, jaxbind_kernel_fn fn, const Args &args,
                       const Rets &rets) {
  thread_local std::vector<jaxbind_buffer> ins, outs;
  char message[1024];
  jaxbind_call call{};
  call.abi_version = JAXBIND_KERNEL_ABI_VERSION;
  call.n_kwargs = static_cast<int64_t>(ks.kwargs.size());
  call.kwargs = ks.kwargs.data();
  call.error = message;
  call.error_size = sizeof(message);
  bool loop = ks.levels > 0 && !ks.batches;
  int64_t n = ks.levels > 0 ? kernel_batch_size(ks, args, rets) : 1;
  if (!loop) {
    n = 1;
    call.batch_levels = ks.levels;
    call.batched = ks.batched.data();
  }
  for (int64_t k = 0; k < n; ++k) {
    describe_kernel_buffers(args, "input", loop ? ks.levels : 0, k, ks.batched.data(), ins);
    describe_kernel_buffers(rets, "output", loop ? ks.levels : 0, k, nullptr, outs);
    call.n_inputs = static_cast<int64_t>(ins.size());
    call.inputs = ins.data();
    call.n_outputs = static_cast<int64_t>(outs.size());
    call.outputs = outs.data();
    message[0] = '\0';
    int32_t status = fn(&call);
    if (status != 0) {
      message[sizeof(message) - 1] = '\0';
      std::string why = message[0] != '\0' ? std::string(message)
                        : status == -1
                            ? std::string("the numba kernel raised an exception (numba's compiled "
                                          "code reports no details: call the function in Python "
                                          "on the same arrays to see it)")
                            : "it returned status " + std::to_string(status) + " and no message";
      throw KernelError("kernel of " + ks.label + " failed: " + why);
    }
  }
}

}  // namespace jaxbind
