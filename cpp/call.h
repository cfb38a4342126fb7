// jaxbind's trampoline: one described call. Whatever runs it (a Python callable, a
// compiled kernel, a GPU plan), a call is its buffers, decoded once from XLA's
// arguments and results, its signature, and jaxbind's batch loop over it. Nothing here
// touches Python.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "jaxbind/kernel.h"
#include "workers.h"
#include "xla_ffi.h"

namespace jaxbind {

namespace ffi = xla::ffi;

// A failure whose message names the binding and the role already (a site's label).
struct LabelledError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where a call runs (the kernel ABI's version 4 fields): the CPU, or a CUDA device, whose
// memory the buffers are, and XLA's stream for the call.
struct Place {
  int64_t platform = JAXBIND_PLATFORM_CPU;
  void *stream = nullptr;
  int64_t device = -1;

  static Place cuda(void *stream, int32_t device) {
    return Place{JAXBIND_PLATFORM_CUDA, stream, device};
  }
};

// One buffer is described as the kernel ABI describes it (jaxbind_buffer: data, XLA
// element type, rank, dimensions), whoever gets it.
using Buffer = jaxbind_buffer;

// The buffers of one call: every input, then every output, without an ordered call's
// token (a TOKEN buffer in first place, which carries no data).
struct Call {
  std::vector<Buffer> ins, outs;
  bool ordered = false;  // it came with a token: its effects keep the program's order

  // Decode XLA's arguments and results, each buffer once. Throws std::invalid_argument.
  void decode(const ffi::RemainingArgs &args, const ffi::RemainingRets &rets) {
    ordered = decode_side(args, "input", ins);
    decode_side(rets, "output", outs);
  }

 private:
  // Returns whether a token came first.
  template <typename Remaining>
  static bool decode_side(const Remaining &all, const char *what, std::vector<Buffer> &out) {
    out.clear();
    bool token = false;
    for (size_t i = 0; i < all.size(); ++i) {
      auto decoded = all.template get<ffi::AnyBuffer>(i);
      if (!decoded.has_value()) throw std::invalid_argument(std::string("cannot decode ") + what);
      ffi::AnyBuffer b = [&]() {
        if constexpr (std::is_same_v<Remaining, ffi::RemainingRets>)
          return **decoded;  // results come wrapped once more
        else
          return *decoded;
      }();
      if (i == 0 && b.element_type() == ffi::DataType::TOKEN) {
        token = true;
        continue;
      }
      auto dims = b.dimensions();
      out.push_back(Buffer{b.untyped_data(), static_cast<int64_t>(b.element_type()),
                           static_cast<int64_t>(dims.size()), dims.begin()});
    }
    return token;
  }
};

// A call's signature: for every input, then every output, its element type, rank and
// dimensions, flattened. A site runs its Python check once per new signature.
struct Signature {
  std::vector<int64_t> words;

  static Signature of(const Call &call) {
    Signature sig;
    for (const auto *side : {&call.ins, &call.outs})
      for (const Buffer &b : *side) {
        sig.words.push_back(b.dtype);
        sig.words.push_back(b.rank);
        sig.words.insert(sig.words.end(), b.dims, b.dims + b.rank);
      }
    return sig;
  }

  bool matches(const Call &call) const {
    size_t pos = 0;
    for (const auto *side : {&call.ins, &call.outs})
      for (const Buffer &b : *side) {
        if (pos + 2 + b.rank > words.size() || words[pos] != b.dtype || words[pos + 1] != b.rank)
          return false;
        pos += 2;
        for (int64_t d = 0; d < b.rank; ++d)
          if (words[pos++] != b.dims[d]) return false;
      }
    return pos == words.size();
  }
};

// The signatures a site has accepted (its Python check passed), each with a value: for
// SiteCore::accepted, the kernel's address for it (nullptr for a Python callable); for a
// CUDA kernel's site, its launch. The least recently used goes first when there are more
// than kKept. Safe on several threads.
template <typename Value>
class AcceptedSignatures {
 public:
  static constexpr size_t kKept = 32;

  bool find(const Call &call, Value &value) {
    std::lock_guard lock(mu_);
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it)
      if (it->first.matches(call)) {
        value = it->second;
        if (it != entries_.rbegin()) {  // most recently used goes last
          auto hit = std::prev(it.base());
          std::rotate(hit, hit + 1, entries_.end());
        }
        return true;
      }
    return false;
  }

  void add(Signature sig, Value value) {
    std::lock_guard lock(mu_);
    if (entries_.size() >= kKept) entries_.erase(entries_.begin());
    entries_.emplace_back(std::move(sig), value);
  }

  size_t size() {
    std::lock_guard lock(mu_);
    return entries_.size();
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<Signature, Value>> entries_;
};

// jaxbind's own batch loop (see jaxbind/_callformat.py, Loop): the leading `levels` axes
// of every output, and of each input whose flag in `batched` is set, form a batch; the
// body is called once per batch element. levels == 0: one plain call.
struct Loop {
  static constexpr int kMaxLevels = 64;  // Python's _callformat.MAX_LEVELS (tested equal)
  int levels = 0;
  std::vector<uint8_t> batched;

  // The number of batch elements, after the one bounds check of a call: one flag per
  // input, and every output and every flagged input leads with the same `levels` axes.
  // Nothing in a program (which may come from a file) may make the loop step outside a
  // buffer. Throws std::invalid_argument.
  int64_t count(const Call &call) const {
    if (levels == 0) return 1;
    if (batched.size() != call.ins.size())
      throw std::invalid_argument("the call's batch flags name " + std::to_string(batched.size()) +
                                  " inputs, but it has " + std::to_string(call.ins.size()));
    if (call.outs.empty()) throw std::invalid_argument("a batched call needs an output");
    const Buffer &first = call.outs[0];
    auto leads = [&](const Buffer &b, const char *what, size_t i) {
      if (b.rank < levels)
        throw std::invalid_argument(std::string(what) + " " + std::to_string(i) + " has rank " +
                                    std::to_string(b.rank) + ", fewer than the call's " +
                                    std::to_string(levels) + " batch levels");
      if (!std::equal(b.dims, b.dims + levels, first.dims))
        throw std::invalid_argument(std::string(what) + " " + std::to_string(i) +
                                    " does not lead with the batch axes of output 0");
    };
    for (size_t i = 0; i < call.outs.size(); ++i) leads(call.outs[i], "output", i);
    for (size_t i = 0; i < call.ins.size(); ++i)
      if (batched[i]) leads(call.ins[i], "input", i);
    int64_t n = 1;
    for (int d = 0; d < levels; ++d) n *= first.dims[d];
    return n;
  }

  // Batch element k of a call whose loop `count` has checked.
  void element(const Call &whole, int64_t k, Call &out) const {
    slice(whole.ins, k, batched.data(), out.ins);
    slice(whole.outs, k, nullptr, out.outs);
  }

  // Run `body(const Call &)` once per batch element (`whole_batch`: once, on the whole
  // call, for a body that takes the batch itself), after the bounds check. `scratch`
  // holds the elements' buffers (a caller may keep it between calls).
  //
  // With `workers` (a kernel's calls, which are safe on several threads at once), the
  // elements of an unordered call may run on several threads: the first runs here, timed,
  // and the others are spread over the workers only when they are worth it, about
  // kWorthSpreading or more of work by that measure. Each element's body then gets the
  // workers' share that the batch leaves it (`body(call, workers)`).
  static constexpr double kWorthSpreading = 50e-6;  // seconds

  template <typename Body>
  void run(const Call &call, bool whole_batch, Call &scratch, Body &&body) const {
    int64_t n = count(call);
    if (levels == 0 || whole_batch) return body(call);
    for (int64_t k = 0; k < n; ++k) {
      element(call, k, scratch);
      body(static_cast<const Call &>(scratch));
    }
  }

  template <typename Body>
  void run(const Call &call, bool whole_batch, Call &scratch, const Workers &workers,
           Body &&body) const {
    int64_t n = count(call);
    if (levels == 0 || whole_batch) return body(call, workers);
    int64_t threads = workers.threads();
    auto serial = [&](int64_t from, int64_t to) {
      for (int64_t k = from; k < to; ++k) {
        element(call, k, scratch);
        body(static_cast<const Call &>(scratch), workers);
      }
    };
    if (n < 2 || call.ordered || threads < 2) return serial(0, n);
    auto start = std::chrono::steady_clock::now();
    serial(0, 1);
    std::chrono::duration<double> first = std::chrono::steady_clock::now() - start;
    int64_t rest = n - 1;
    if (first.count() * static_cast<double>(rest) < kWorthSpreading) return serial(1, n);
    // chunks of consecutive elements, a few per thread (a slow thread then holds up
    // little), each with buffers of its own
    int64_t chunks = std::min(rest, 4 * threads);
    Workers each = workers.limited(std::max<int64_t>(1, threads / n));
    workers.run(chunks, [&](int64_t c) {
      Call local;
      for (int64_t k = 1 + rest * c / chunks; k < 1 + rest * (c + 1) / chunks; ++k) {
        element(call, k, local);
        body(static_cast<const Call &>(local), each);
      }
    });
  }

 private:
  void slice(const std::vector<Buffer> &whole, int64_t k, const uint8_t *flags,
             std::vector<Buffer> &out) const {
    out.resize(whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      Buffer b = whole[i];
      if (flags == nullptr || flags[i]) {
        auto bytes = static_cast<int64_t>(ffi::ByteWidth(static_cast<ffi::DataType>(b.dtype)));
        for (int64_t d = levels; d < b.rank; ++d) bytes *= b.dims[d];
        b.data = static_cast<char *>(b.data) + k * bytes;
        b.rank -= levels;
        b.dims += levels;
      }
      out[i] = b;
    }
  }
};

}  // namespace jaxbind
