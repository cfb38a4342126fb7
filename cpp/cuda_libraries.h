// jaxbind's kernels for CUDA libraries (jaxbind.contrib.cuda): kernel ABI version 4 bodies
// and C states (jaxbind/kernel.h) that call a CUDA library's plan-based C API on XLA's
// stream. Built without the CUDA toolkit: the library is opened by its path (dlopen) at
// the state's setup, its entry points found by name, and its types declared here by
// their documented C layout (a plan is an int or a pointer; streams and device pointers
// are opaque). A state holds the library and the plans of one call site on one device:
// made at the device's first call (jaxbind's per-device state), with the device current,
// one per stream XLA calls on, and destroyed with the state. Nothing here touches Python.
//
//   cuFFT      an n-dimensional complex FFT, batched (cufftPlanMany; cufftSetStream)
//   cufinufft  NUFFTs of types 1 and 2 of a point set, each the other's transpose: a plan
//              per type (makeplan with the stream in its options), setpts and execute per
//              call; the options' layout comes from Python (cufinufft's own ctypes
//              description of its struct), as byte offsets
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jaxbind/kernel.h"

namespace jaxbind::cuda_libraries {

// --- the ABI's keyword arguments, by name ------------------------------------------------

inline const jaxbind_kwarg *kwarg(int64_t n, const jaxbind_kwarg *kwargs, const char *name) {
  for (int64_t k = 0; k < n; ++k)
    if (std::strcmp(kwargs[k].name, name) == 0) return &kwargs[k];
  return nullptr;
}

// A failure: its message, for the ABI's error channel.
struct Failed {
  std::string why;
};

inline int64_t int_arg(const jaxbind_setup *s, const char *name) {
  const jaxbind_kwarg *k = kwarg(s->n_kwargs, s->kwargs, name);
  if (k == nullptr || (k->type != JAXBIND_KWARG_INT && k->type != JAXBIND_KWARG_BOOL))
    throw Failed{std::string("needs the integer keyword argument '") + name + "'"};
  return k->int_value;
}

inline double float_arg(const jaxbind_setup *s, const char *name) {
  const jaxbind_kwarg *k = kwarg(s->n_kwargs, s->kwargs, name);
  if (k == nullptr || k->type != JAXBIND_KWARG_FLOAT)
    throw Failed{std::string("needs the float keyword argument '") + name + "'"};
  return k->float_value;
}

inline std::string string_arg(const jaxbind_setup *s, const char *name) {
  const jaxbind_kwarg *k = kwarg(s->n_kwargs, s->kwargs, name);
  if (k == nullptr || k->type != JAXBIND_KWARG_STRING)
    throw Failed{std::string("needs the string keyword argument '") + name + "'"};
  return std::string(k->string, static_cast<size_t>(k->string_size));
}

inline std::vector<int64_t> ints_arg(const jaxbind_setup *s, const char *name) {
  const jaxbind_kwarg *k = kwarg(s->n_kwargs, s->kwargs, name);
  if (k == nullptr || k->type != JAXBIND_KWARG_ARRAY || k->array.dtype != JAXBIND_INT64 ||
      k->array.rank != 1)
    throw Failed{std::string("needs the int64 array keyword argument '") + name + "'"};
  const auto *v = static_cast<const int64_t *>(k->array.data);
  return std::vector<int64_t>(v, v + k->array.dims[0]);
}

inline void write(char *error, int64_t size, const std::string &why) {
  if (size > 0) std::snprintf(error, static_cast<size_t>(size), "%s", why.c_str());
}

// A library opened by path, its entry points found by name (`prefix` + name).
class Library {
 public:
  explicit Library(const std::string &path) : path_(path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char *why = dlerror();
      throw Failed{"cannot open " + path + ": " + (why ? why : "dlopen failed")};
    }
  }
  ~Library() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Library(const Library &) = delete;
  Library &operator=(const Library &) = delete;

  template <typename Fn>
  void find(Fn &slot, const std::string &name) const {
    slot = reinterpret_cast<Fn>(dlsym(handle_, name.c_str()));
    if (slot == nullptr) throw Failed{path_ + " has no " + name};
  }

 private:
  std::string path_;
  void *handle_ = nullptr;
};

// A state's plans, one per stream that calls reach it on (XLA uses one per device as a
// rule), made by `make` at a stream's first call.
template <typename Plan>
class PerStream {
 public:
  template <typename Make>
  Plan &on(void *stream, Make &&make) {
    for (auto &[s, plan] : plans_)
      if (s == stream) return plan;
    plans_.emplace_back(stream, make());
    return plans_.back().second;
  }
  template <typename Destroy>
  void clear(Destroy &&destroy) {
    for (auto &[s, plan] : plans_) destroy(plan);
    plans_.clear();
  }
  size_t size() const { return plans_.size(); }

 private:
  std::vector<std::pair<void *, Plan>> plans_;
};

// The ABI's boundary: a C++ failure becomes the call's (or the setup's) message.
template <typename Body>
int32_t guarded(char *error, int64_t error_size, const char *what, Body &&body) {
  try {
    body();
    return 0;
  } catch (Failed &f) {
    write(error, error_size, std::string(what) + ": " + f.why);
  } catch (std::exception &e) {
    write(error, error_size, std::string(what) + ": " + e.what());
  }
  return 1;
}

inline void need_cuda(int64_t platform, const char *what) {
  if (platform != JAXBIND_PLATFORM_CUDA)
    throw Failed{std::string(what) + " runs in GPU programs (its buffers are device memory)"};
}

// A setup's caller must tell it the device and the stream (ABI version 4), for a GPU.
inline void need_cuda_setup(const jaxbind_setup *s, const char *what) {
  if (s->abi_version < 4) throw Failed{"its caller predates kernel ABI version 4"};
  need_cuda(s->platform, what);
}

// A call's state, made by its library's setup for the call's device.
template <typename State>
State &state_of(const jaxbind_call *call, const char *what) {
  need_cuda(call->platform, what);
  auto *state = static_cast<State *>(call->state);
  if (state == nullptr) throw Failed{"its op has no state (jaxbind.contrib.cuda makes one)"};
  if (call->device != state->device)
    throw Failed{"the call is on device " + std::to_string(call->device) + ", its plan on device " +
                 std::to_string(state->device)};
  return *state;
}

inline int64_t elements(const jaxbind_buffer &b) {
  int64_t n = 1;
  for (int64_t d = 0; d < b.rank; ++d) n *= b.dims[d];
  return n;
}

// --- cuFFT ---------------------------------------------------------------------------------

namespace cufft {

// cufftType and directions, as cufft.h numbers them
constexpr int kC2C = 0x29, kZ2Z = 0x69, kForward = -1, kInverse = 1;

struct State {
  Library library;
  int (*plan_many)(int *plan, int rank, int *n, int *inembed, int istride, int idist, int *onembed,
                   int ostride, int odist, int type, int batch) = nullptr;
  int (*set_stream)(int plan, void *stream) = nullptr;
  int (*exec_c2c)(int plan, void *in, void *out, int direction) = nullptr;
  int (*exec_z2z)(int plan, void *in, void *out, int direction) = nullptr;
  int (*destroy)(int plan) = nullptr;
  std::vector<int> shape;  // the transform's axes
  int batch = 1, type = kC2C;
  int64_t device = -1;
  PerStream<int> plans;

  explicit State(const std::string &path) : library(path) {}
  ~State() {
    plans.clear([&](int plan) { destroy(plan); });
  }
};

// Setup keyword arguments: library (the path of libcufft), shape (int64[rank]), batch,
// double (bool: complex128, else complex64).
inline int32_t setup(const jaxbind_setup *s, void **out) {
  return guarded(s->error, s->error_size, "cuFFT's setup", [&] {
    need_cuda_setup(s, "a cuFFT plan");
    auto state = std::make_unique<State>(string_arg(s, "library"));
    state->library.find(state->plan_many, "cufftPlanMany");
    state->library.find(state->set_stream, "cufftSetStream");
    state->library.find(state->exec_c2c, "cufftExecC2C");
    state->library.find(state->exec_z2z, "cufftExecZ2Z");
    state->library.find(state->destroy, "cufftDestroy");
    for (int64_t n : ints_arg(s, "shape")) state->shape.push_back(static_cast<int>(n));
    if (state->shape.empty() || state->shape.size() > 3)
      throw Failed{"transforms of 1 to 3 axes, not " + std::to_string(state->shape.size())};
    state->batch = static_cast<int>(int_arg(s, "batch"));
    state->type = int_arg(s, "double") ? kZ2Z : kC2C;
    state->device = s->device;
    *out = state.release();
  });
}

inline void teardown(void *state) { delete static_cast<State *>(state); }

// One call: input 0 the array, output 0 its transform (forward: the keyword argument
// forward, a bool), batch and shape as the state's.
inline int32_t execute(const jaxbind_call *call) {
  return guarded(call->error, call->error_size, "cuFFT", [&] {
    State *state = &state_of<State>(call, "a cuFFT transform");
    const jaxbind_kwarg *forward = kwarg(call->n_kwargs, call->kwargs, "forward");
    int direction = forward != nullptr && forward->int_value == 0 ? kInverse : kForward;
    int plan = state->plans.on(call->stream, [&] {
      int made = 0;
      int status =
          state->plan_many(&made, static_cast<int>(state->shape.size()), state->shape.data(),
                           nullptr, 1, 0, nullptr, 1, 0, state->type, state->batch);
      if (status != 0) throw Failed{"cufftPlanMany failed with status " + std::to_string(status)};
      return made;
    });
    int status = state->set_stream(plan, call->stream);
    if (status == 0)
      status = (state->type == kZ2Z ? state->exec_z2z : state->exec_c2c)(
          plan, call->inputs[0].data, call->outputs[0].data, direction);
    if (status != 0) throw Failed{"the transform failed with status " + std::to_string(status)};
  });
}

}  // namespace cufft

// --- cufinufft -----------------------------------------------------------------------------

namespace cufinufft {

struct State {
  Library library;
  void (*default_opts)(void *opts) = nullptr;
  int (*makeplan_f)(int type, int dim, int64_t *modes, int iflag, int ntransf, float eps,
                    void **plan, void *opts) = nullptr;
  int (*makeplan_d)(int type, int dim, int64_t *modes, int iflag, int ntransf, double eps,
                    void **plan, void *opts) = nullptr;
  int (*setpts)(void *plan, int64_t m, void *x, void *y, void *z, int64_t n, void *s, void *t,
                void *u) = nullptr;
  int (*execute)(void *plan, void *c, void *f) = nullptr;
  int (*destroy)(void *plan) = nullptr;
  int iflag = 1;
  bool single = true;
  double eps = 1e-6;
  std::vector<int64_t> modes;            // per axis
  std::vector<char> opts;                // cufinufft_opts, as its defaults gave them
  int64_t stream_at = 0, device_at = 0;  // byte offsets of gpu_stream and gpu_device_id
  int64_t modeord_at = 0, modeord = 0;   // and modeord, and its value
  int64_t device = -1;
  PerStream<void *> plans[2];  // type 1's, type 2's

  explicit State(const std::string &path) : library(path) {}
  ~State() {
    for (auto &made : plans) made.clear([&](void *plan) { destroy(plan); });
  }
};

// Setup keyword arguments: library (the path of libcufinufft), modes
// (int64[dim]), iflag, eps, single (bool: complex64 and float32 points), modeord, and the
// options' layout from cufinufft's ctypes struct: opts_size, stream_at, device_at,
// modeord_at (byte offsets).
inline int32_t setup(const jaxbind_setup *s, void **out) {
  return guarded(s->error, s->error_size, "cufinufft's setup", [&] {
    need_cuda_setup(s, "a cufinufft plan");
    auto state = std::make_unique<State>(string_arg(s, "library"));
    state->single = int_arg(s, "single") != 0;
    const std::string p = state->single ? "cufinufftf_" : "cufinufft_";
    state->library.find(state->default_opts, "cufinufft_default_opts");
    if (state->single)
      state->library.find(state->makeplan_f, p + "makeplan");
    else
      state->library.find(state->makeplan_d, p + "makeplan");
    state->library.find(state->setpts, p + "setpts");
    state->library.find(state->execute, p + "execute");
    state->library.find(state->destroy, p + "destroy");
    state->iflag = int_arg(s, "iflag") >= 0 ? 1 : -1;
    state->eps = float_arg(s, "eps");
    state->modes = ints_arg(s, "modes");
    if (state->modes.empty() || state->modes.size() > 3)
      throw Failed{"1 to 3 dimensions, not " + std::to_string(state->modes.size())};
    int64_t size = int_arg(s, "opts_size");
    state->stream_at = int_arg(s, "stream_at");
    state->device_at = int_arg(s, "device_at");
    state->modeord_at = int_arg(s, "modeord_at");
    state->modeord = int_arg(s, "modeord");
    for (int64_t at : {state->stream_at, state->device_at, state->modeord_at})
      if (at < 0 || at + 8 > size) throw Failed{"an option's offset is outside the options"};
    state->opts.assign(static_cast<size_t>(size), 0);
    state->default_opts(state->opts.data());
    state->device = s->device;
    *out = state.release();
  });
}

inline void teardown(void *state) { delete static_cast<State *>(state); }

// One call of a type-`type` transform: inputs the dim coordinates (each (M,), float32 or
// float64 by precision), then the values (type 1: (M,), type 2: the modes' grid); output
// the other side.
inline int32_t execute(const jaxbind_call *call, int type) {
  return guarded(call->error, call->error_size, "cufinufft", [&] {
    State *state = &state_of<State>(call, "a cufinufft transform");
    auto dim = static_cast<int64_t>(state->modes.size());
    if (call->n_inputs != dim + 1 || call->n_outputs != 1)
      throw Failed{"takes " + std::to_string(dim) + " coordinates and the values"};
    void *plan = state->plans[type - 1].on(call->stream, [&] {
      std::vector<char> opts = state->opts;  // this stream's, on this device
      void *stream = call->stream;
      int device = static_cast<int>(state->device), modeord = static_cast<int>(state->modeord);
      std::memcpy(opts.data() + state->stream_at, &stream, sizeof(stream));
      std::memcpy(opts.data() + state->device_at, &device, sizeof(device));
      std::memcpy(opts.data() + state->modeord_at, &modeord, sizeof(modeord));
      // (the C API counts axes from the fastest: the grid's last axis, whose coordinate is
      // the last one given, comes first; the rest are 1)
      std::vector<int64_t> modes(state->modes.rbegin(), state->modes.rend());
      modes.resize(3, 1);
      void *made = nullptr;
      int status = state->single
                       ? state->makeplan_f(type, static_cast<int>(dim), modes.data(), state->iflag,
                                           1, static_cast<float>(state->eps), &made, opts.data())
                       : state->makeplan_d(type, static_cast<int>(dim), modes.data(), state->iflag,
                                           1, state->eps, &made, opts.data());
      // (status 1 is cufinufft's warning that eps is finer than the precision reaches: the
      // plan is made, to the finest it can; other nonzero statuses made none)
      if (status > 1 || made == nullptr)
        throw Failed{"makeplan failed with status " + std::to_string(status)};
      return made;
    });
    void *xyz[3] = {nullptr, nullptr, nullptr};
    for (int64_t a = 0; a < dim; ++a) xyz[a] = call->inputs[dim - 1 - a].data;  // (as modes)
    int64_t m = elements(call->inputs[0]);
    int status = state->setpts(plan, m, xyz[0], xyz[1], xyz[2], 0, nullptr, nullptr, nullptr);
    if (status != 0) throw Failed{"setpts failed with status " + std::to_string(status)};
    void *values = call->inputs[dim].data, *result = call->outputs[0].data;
    status =
        type == 1 ? state->execute(plan, values, result) : state->execute(plan, result, values);
    if (status != 0) throw Failed{"execute failed with status " + std::to_string(status)};
  });
}

inline int32_t type1(const jaxbind_call *call) { return execute(call, 1); }
inline int32_t type2(const jaxbind_call *call) { return execute(call, 2); }

}  // namespace cufinufft

}  // namespace jaxbind::cuda_libraries
