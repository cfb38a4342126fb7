// jaxbind's trampoline: compiled kernels (the C ABI of jaxbind/kernel.h), called without
// the GIL.
//
// A site whose body is a kernel has a KernelSite beside its Python Site. The handler
// looks it up by the call's digest in `kernel_sites` before it takes the GIL; for a
// buffer signature the site has already checked, it calls the kernel (once per batch
// element, or once for a batching kernel) without creating any Python object. A new
// signature goes through the GIL path once: the Site's check against the abstract
// function, and the kernel's address for that signature (numba kernels are compiled
// per signature). The table holds counted references, so a call in flight keeps its
// KernelSite alive when its Site goes.
#pragma once

#include <mutex>

#include "jaxbind/kernel.h"
#include "state.h"

namespace jaxbind {

struct KernelSite {
  std::atomic<int> refs{0};  // see KernelRef
  bool batches = false;      // the kernel takes the whole batch (batch_levels in the call)
  int levels = 0;
  std::vector<uint8_t> batched;
  std::string label;  // "'<binding>' (<role>)", for errors
  // The static keyword arguments, owned here: names, strings and array data.
  std::vector<std::string> names, strings;
  std::vector<std::vector<char>> array_data;
  std::vector<std::vector<int64_t>> array_dims;
  std::vector<jaxbind_kwarg> kwargs;
  // Buffer signatures already checked, each with the kernel's address for it.
  std::mutex mu;
  std::vector<std::pair<std::vector<int64_t>, jaxbind_kernel_fn>> known;
  // Cleared when its Site goes: a thread's cached pointer to it is then stale.
  std::atomic<bool> alive{true};
  // Unique in the process (addresses of freed sites are reused): the key of threads' caches.
  uint64_t id = next_id.fetch_add(1) + 1;
  static inline std::atomic<uint64_t> next_id{0};

  void add(std::vector<int64_t> signature, jaxbind_kernel_fn fn) {
    std::lock_guard lock(mu);
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
inline void retain(KernelSite *site) { site->refs.fetch_add(1, std::memory_order_relaxed); }
inline void release(KernelSite *site) {
  if (site->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete site;
}

inline KernelRef make_kernel_site(nb::handle kernel, std::string label, int levels,
                                  const std::vector<bool> &batched) {
  KernelRef ks(new KernelSite());
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
inline std::mutex kernel_mu;
inline std::unordered_map<int64_t, KernelRef> kernel_sites;

// What each thread keeps between kernel calls, in one place (one thread-local lookup
// per call): the last site it found and the last signature it matched, and buffers.
struct KernelCache {
  int64_t digest = 0;
  KernelRef site;         // keeps the site alive while this thread uses it
  uint64_t sig_site = 0;  // KernelSite::id of the signature below
  std::vector<int64_t> sig;
  jaxbind_kernel_fn fn = nullptr;
  std::vector<jaxbind_buffer> ins, outs, in_k, out_k;
};

inline KernelCache &kernel_cache() {
  thread_local KernelCache cache;
  return cache;
}

// The kernel site of a digest. Each thread remembers the last one it found, so a loop
// of calls of one site takes no lock; the pointer stays valid while `cache` holds it.
inline KernelSite *find_kernel_site(int64_t digest, KernelCache &cache) {
  if (cache.site && cache.digest == digest && cache.site->alive.load(std::memory_order_acquire))
    return cache.site.get();
  std::lock_guard lock(kernel_mu);
  auto it = kernel_sites.find(digest);
  if (it == kernel_sites.end()) return nullptr;
  cache.digest = digest;
  cache.site = it->second;
  return cache.site.get();
}

// The buffers of a call in the ABI's form: every input, or every output, whole.
template <typename Remaining>
void describe_buffers(const Remaining &buffers, const char *what,
                      std::vector<jaxbind_buffer> &out) {
  out.resize(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    ffi::AnyBuffer b = buffer_at(buffers, i, what);
    auto dims = b.dimensions();
    out[i] = jaxbind_buffer{b.untyped_data(), static_cast<int64_t>(b.element_type()),
                            static_cast<int64_t>(dims.size()), dims.begin()};
  }
}

// The same, straight from XLA's arguments or results, decoding each buffer once (an
// ordered call's token, a TOKEN buffer in first place, is left out).
template <typename Remaining>
void describe_all(const Remaining &all, const char *what, std::vector<jaxbind_buffer> &out) {
  out.clear();
  for (size_t i = 0; i < all.size(); ++i) {
    auto decoded = all.template get<ffi::AnyBuffer>(i);
    if (!decoded.has_value()) throw std::invalid_argument(std::string("cannot decode ") + what);
    ffi::AnyBuffer b = [&]() {
      if constexpr (std::is_same_v<Remaining, ffi::RemainingRets>)
        return **decoded;
      else
        return *decoded;
    }();
    if (i == 0 && b.element_type() == ffi::DataType::TOKEN) continue;
    auto dims = b.dimensions();
    out.push_back(jaxbind_buffer{b.untyped_data(), static_cast<int64_t>(b.element_type()),
                                 static_cast<int64_t>(dims.size()), dims.begin()});
  }
}

// Whether described buffers have the signature `sig` (a Site's `known` form: element
// type, rank and dimensions of every input, then every output).
inline bool same_signature(const std::vector<int64_t> &sig, const std::vector<jaxbind_buffer> &ins,
                           const std::vector<jaxbind_buffer> &outs) {
  size_t pos = 0;
  for (const auto *side : {&ins, &outs})
    for (const jaxbind_buffer &b : *side) {
      if (pos + 2 + b.rank > sig.size() || sig[pos] != b.dtype || sig[pos + 1] != b.rank)
        return false;
      pos += 2;
      for (int64_t d = 0; d < b.rank; ++d)
        if (sig[pos++] != b.dims[d]) return false;
    }
  return pos == sig.size();
}

// The kernel's address for the buffers' signature, if the site has checked it. Each
// thread remembers its last hit, so a loop of calls with one signature takes no lock.
// (Addresses stay valid for the site's life: numba kernels keep every compiled form.)
inline jaxbind_kernel_fn find_kernel(KernelSite &ks, const std::vector<jaxbind_buffer> &ins,
                                     const std::vector<jaxbind_buffer> &outs, KernelCache &cache) {
  if (cache.sig_site == ks.id && same_signature(cache.sig, ins, outs)) return cache.fn;
  std::lock_guard lock(ks.mu);
  for (auto &[sig, fn] : ks.known)
    if (same_signature(sig, ins, outs)) {
      cache.sig_site = ks.id;
      cache.sig = sig;
      cache.fn = fn;
      return fn;
    }
  return nullptr;
}

// Number of batch elements, after checking that every output and each batched input
// leads with the same `levels` axes (nothing in a program may make the loop step
// outside a buffer).
inline int64_t kernel_batch_size(const KernelSite &ks, const std::vector<jaxbind_buffer> &ins,
                                 const std::vector<jaxbind_buffer> &outs) {
  if (ks.batched.size() != ins.size())
    throw std::invalid_argument("the call's batch flags name " + std::to_string(ks.batched.size()) +
                                " inputs, but it has " + std::to_string(ins.size()));
  if (outs.empty()) throw std::invalid_argument("a batched call needs an output");
  auto leads = [&](const jaxbind_buffer &b, const char *what, size_t i) {
    if (b.rank < ks.levels)
      throw std::invalid_argument(std::string(what) + " " + std::to_string(i) +
                                  " has fewer axes than the call's batch levels");
    for (int d = 0; d < ks.levels; ++d)
      if (b.dims[d] != outs[0].dims[d])
        throw std::invalid_argument(std::string(what) + " " + std::to_string(i) +
                                    " does not lead with the batch axes of output 0");
  };
  for (size_t i = 0; i < outs.size(); ++i) leads(outs[i], "output", i);
  for (size_t i = 0; i < ins.size(); ++i)
    if (ks.batched[i]) leads(ins[i], "input", i);
  int64_t n = 1;
  for (int d = 0; d < ks.levels; ++d) n *= outs[0].dims[d];
  return n;
}

// Batch element k of described buffers (the leading `levels` axes dropped where batched).
inline void element_of(const std::vector<jaxbind_buffer> &whole, int levels, int64_t k,
                       const uint8_t *batched, std::vector<jaxbind_buffer> &out) {
  out.resize(whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    jaxbind_buffer b = whole[i];
    if (batched == nullptr || batched[i]) {
      int64_t bytes = static_cast<int64_t>(ffi::ByteWidth(static_cast<ffi::DataType>(b.dtype)));
      for (int64_t d = levels; d < b.rank; ++d) bytes *= b.dims[d];
      b.data = static_cast<char *>(b.data) + k * bytes;
      b.rank -= levels;
      b.dims += levels;
    }
    out[i] = b;
  }
}

// Run a kernel on a call's described buffers: no GIL needed, no Python object made.
// Throws KernelError with the kernel's message if it fails.
inline void run_kernel(KernelSite &ks, jaxbind_kernel_fn fn, const std::vector<jaxbind_buffer> &ins,
                       const std::vector<jaxbind_buffer> &outs, KernelCache &cache) {
  char message[1024];
  jaxbind_call call{};
  call.abi_version = JAXBIND_KERNEL_ABI_VERSION;
  call.n_kwargs = static_cast<int64_t>(ks.kwargs.size());
  call.kwargs = ks.kwargs.data();
  call.error = message;
  call.error_size = sizeof(message);
  call.n_inputs = static_cast<int64_t>(ins.size());
  call.n_outputs = static_cast<int64_t>(outs.size());
  auto check = [&](int32_t status) {
    if (status == 0) return;
    message[sizeof(message) - 1] = '\0';
    std::string why = message[0] != '\0' ? std::string(message)
                      : status == -1
                          ? std::string(
                                "the numba kernel raised an exception (numba's compiled "
                                "code reports no details: call the function in Python "
                                "on the same arrays to see it)")
                          : "it returned status " + std::to_string(status) + " and no message";
    throw KernelError("kernel of " + ks.label + " failed: " + why);
  };
  message[0] = '\0';
  if (ks.levels == 0 || ks.batches) {  // one call: unbatched, or the kernel takes the batch
    if (ks.levels > 0) kernel_batch_size(ks, ins, outs);
    call.batch_levels = ks.levels;
    call.batched = ks.batched.data();
    call.inputs = ins.data();
    call.outputs = outs.data();
    return check(fn(&call));
  }
  std::vector<jaxbind_buffer> &in_k = cache.in_k, &out_k = cache.out_k;
  int64_t n = kernel_batch_size(ks, ins, outs);
  for (int64_t k = 0; k < n; ++k) {
    element_of(ins, ks.levels, k, ks.batched.data(), in_k);
    element_of(outs, ks.levels, k, nullptr, out_k);
    call.inputs = in_k.data();
    call.outputs = out_k.data();
    check(fn(&call));
  }
}

}  // namespace jaxbind
