// The floor of a compiled kernel's call: an XLA FFI handler registered by hand that calls
// a kernel of jaxbind's C ABI (jaxbind/kernel.h) at the address in its attribute `fn`,
// with no GIL, no lookup and no check. benchmarks/kernels.py compiles it on first use.

#include <cstring>
#include <vector>

#include "jaxbind/kernel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static ffi::Error KernelFloor(ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t fn) {
  jaxbind_buffer ins[8], outs[8];
  for (size_t i = 0; i < args.size() && i < 8; ++i) {
    auto b = *args.get<ffi::AnyBuffer>(i);
    ins[i] = {b.untyped_data(), static_cast<int64_t>(b.element_type()),
              static_cast<int64_t>(b.dimensions().size()), b.dimensions().begin()};
  }
  for (size_t i = 0; i < rets.size() && i < 8; ++i) {
    auto b = **rets.get<ffi::AnyBuffer>(i);
    outs[i] = {b.untyped_data(), static_cast<int64_t>(b.element_type()),
               static_cast<int64_t>(b.dimensions().size()), b.dimensions().begin()};
  }
  char error[256];
  jaxbind_call call{JAXBIND_KERNEL_ABI_VERSION,
                    static_cast<int64_t>(args.size()),
                    ins,
                    static_cast<int64_t>(rets.size()),
                    outs,
                    0,
                    nullptr,
                    0,
                    nullptr,
                    error,
                    sizeof(error)};
  if (reinterpret_cast<jaxbind_kernel_fn>(fn)(&call) != 0)
    return ffi::Error(ffi::ErrorCode::kInternal, "kernel failed");
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kernel_floor_handler, KernelFloor,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attr<int64_t>("fn"));

// The same, bound as jaxbind's handler is (a dictionary of attributes), for calls that
// carry every attribute of a jaxbind call: what XLA itself spends on them.
static ffi::Error KernelFloorDict(ffi::RemainingArgs args, ffi::RemainingRets rets,
                                  ffi::Dictionary attrs) {
  auto fn = attrs.get<int64_t>("fn");
  if (!fn.has_value()) return ffi::Error(ffi::ErrorCode::kInvalidArgument, "no fn");
  return KernelFloor(args, rets, *fn);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    kernel_floor_dict_handler, KernelFloorDict,
    ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs<ffi::Dictionary>());
