// jaxbind's trampoline: CUDA kernels (jaxbind.cuda_kernel), launched from C++ on XLA's
// stream, with no Python and no GIL once a site knows the call's signature.
//
// The CUDA driver API is loaded from libcuda.so.1 (which every NVIDIA driver installs) at
// the first launch, so the extension is built without the CUDA toolkit. A site's module
// is loaded into each device's context at its first call there; each signature's launch
// (grid, block, dynamic shared memory, the scalar parameters' bytes) was worked out in
// Python when the site accepted it (jaxbind/_kernels/cuda.py; read by site.h). A launch
// passes each output's device pointer, then each input's, then the scalars. Nothing here
// touches Python.
#pragma once

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "call.h"

namespace jaxbind {

// The few driver entry points a launch needs.
class CudaDriver {
 public:
  using Result = int;  // CUresult: 0 is CUDA_SUCCESS
  Result (*module_load_data)(void **module, const void *image) = nullptr;
  Result (*module_get_function)(void **function, void *module, const char *name) = nullptr;
  Result (*launch_kernel)(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned shared, void *stream, void **params,
                          void **extra) = nullptr;
  Result (*get_error_string)(Result status, const char **text) = nullptr;
  Result (*exchange_capture_mode)(int *mode) = nullptr;  // cuThreadExchangeStreamCaptureMode
  Result (*func_set_attribute)(void *function, int attribute, int value) = nullptr;

  // The process's driver, loaded once. Throws std::runtime_error without one.
  static const CudaDriver &get() {
    static const CudaDriver driver;
    if (!driver.error_.empty()) throw std::runtime_error(driver.error_);
    return driver;
  }

  // Throws `what` failed, with the driver's name for `status`, unless it is success.
  void check(Result status, const std::string &what) const {
    if (status == 0) return;
    const char *text = nullptr;
    if (get_error_string == nullptr || get_error_string(status, &text) != 0 || text == nullptr)
      text = "unknown error";
    throw std::runtime_error(what + " failed: CUDA driver error " + std::to_string(status) + " (" +
                             text + ")");
  }

 private:
  CudaDriver() {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char *why = dlerror();
      error_ = std::string("cannot load the CUDA driver (libcuda.so.1): ") + (why ? why : "");
      return;
    }
    auto find = [&](auto &slot, const char *name) {
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlsym(lib, name));
      if (slot == nullptr && error_.empty())
        error_ = std::string("the CUDA driver has no ") + name + ": it is older than CUDA 10.1";
    };
    find(module_load_data, "cuModuleLoadData");
    find(module_get_function, "cuModuleGetFunction");
    find(launch_kernel, "cuLaunchKernel");
    find(get_error_string, "cuGetErrorString");
    find(exchange_capture_mode, "cuThreadExchangeStreamCaptureMode");
    find(func_set_attribute, "cuFuncSetAttribute");
  }
  std::string error_;
};

// Launches of CUDA kernels by jaxbind's handlers in this process (what XLA replays from
// a captured CUDA graph does not call them): for tests and benchmarks.
inline std::atomic<int64_t> cuda_launches{0};

// One signature's launch: grid and block (x, y, z), dynamic shared memory in bytes, and
// each scalar parameter's bytes (8-byte words, so that every type is aligned).
struct Launch {
  std::array<unsigned, 3> grid{1, 1, 1}, block{1, 1, 1};
  unsigned shared = 0;
  std::vector<std::vector<uint64_t>> scalars;
};

// A CUDA kernel site: its module and function name, the function per device, and the
// launch of each signature the site accepted. Safe on several threads.
class CudaKernelSite {
 public:
  CudaKernelSite(std::string image, std::string entry)
      : image_(std::move(image)), entry_(std::move(entry)) {}

  // The launch accepted for the call's signature, or nullptr (the site's check has not
  // seen it, or not among the last few: ask Python). The pointer stays valid for the
  // site's life.
  const Launch *find(const Call &call) {
    const Launch *found = nullptr;
    return launches_.find(call, found) ? found : nullptr;
  }

  size_t accepted_count() { return launches_.size(); }

  void add(const Call &call, Launch launch) {
    const Launch *kept;
    {
      std::lock_guard lock(mu_);
      kept = &made_.emplace_back(std::move(launch));
    }
    launches_.add(Signature::of(call), kept);
  }

  // Launch the kernel on one (batch element of a) call, on `stream` of `device`. Throws
  // std::runtime_error, prefixed with `label`.
  void launch(const Launch &launch, const Call &call, void *stream, int32_t device,
              const std::string &label) const {
    const CudaDriver &driver = CudaDriver::get();
    void *fn = function(driver, device, label);
    if (launch.shared >
        48 * 1024)  // beyond the default: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
      driver.check(driver.func_set_attribute(fn, 8, static_cast<int>(launch.shared)),
                   "CUDA kernel of " + label + ": asking for " + std::to_string(launch.shared) +
                       " bytes of dynamic shared memory");
    // cuLaunchKernel reads each parameter's value from an address: the buffers' pointers
    // (outputs, then inputs), then the scalars
    std::array<void *, 64> fixed;
    std::vector<void *> grown;
    size_t n = call.outs.size() + call.ins.size() + launch.scalars.size();
    void **params = fixed.data();
    if (n > fixed.size()) {
      grown.resize(n);
      params = grown.data();
    }
    size_t i = 0;
    for (const Buffer &b : call.outs) params[i++] = const_cast<void **>(&b.data);
    for (const Buffer &b : call.ins) params[i++] = const_cast<void **>(&b.data);
    for (const auto &words : launch.scalars) params[i++] = const_cast<uint64_t *>(words.data());
    driver.check(driver.launch_kernel(fn, launch.grid[0], launch.grid[1], launch.grid[2],
                                      launch.block[0], launch.block[1], launch.block[2],
                                      launch.shared, stream, params, nullptr),
                 "CUDA kernel of " + label + ": cuLaunchKernel");
    cuda_launches.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  // The function in `device`'s context, its module loaded at the first call there (in the
  // context XLA made current). A load while XLA captures the stream into a CUDA graph is
  // done in relaxed capture mode: loading is no stream work, and the graph needs none.
  void *function(const CudaDriver &driver, int32_t device, const std::string &label) const {
    std::lock_guard lock(mu_);
    auto found = functions_.find(device);
    if (found != functions_.end()) return found->second;
    int mode = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED
    driver.check(driver.exchange_capture_mode(&mode), "cuThreadExchangeStreamCaptureMode");
    void *module = nullptr, *fn = nullptr;
    CudaDriver::Result loaded = driver.module_load_data(&module, image_.data());
    CudaDriver::Result got =
        loaded == 0 ? driver.module_get_function(&fn, module, entry_.c_str()) : loaded;
    driver.exchange_capture_mode(&mode);  // the thread's mode as it was
    driver.check(loaded, "CUDA kernel of " + label + ": loading its module (cuModuleLoadData)");
    driver.check(got, "CUDA kernel of " + label + ": finding function '" + entry_ +
                          "' in its module (cuModuleGetFunction; an extern \"C\" name, or "
                          "the mangled one)");
    // (modules stay loaded: a site's functions may be captured in graphs XLA still holds)
    functions_.emplace(device, fn);
    return fn;
  }

  std::string image_, entry_;
  mutable std::mutex mu_;    // guards made_ and functions_
  std::deque<Launch> made_;  // every launch made (stable addresses)
  AcceptedSignatures<const Launch *> launches_;
  mutable std::unordered_map<int32_t, void *> functions_;
};

}  // namespace jaxbind
