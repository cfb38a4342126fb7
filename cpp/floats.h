// IEEE floating point for bodies: a body computes in jaxbind what it computes when called
// from Python.
//
// XLA runs its CPU threads with subnormal numbers flushed to zero (x86: MXCSR's FTZ and
// DAZ bits; AArch64: FPCR's FZ bit), which its own kernels expect. A body called on such a
// thread would silently read subnormal inputs as zero and flush subnormal results (a
// NumPy callable's 1e-310 * 0.5 gives 0 instead of 5e-311). `IeeeFloats` clears those
// bits for the body's duration and restores XLA's mode after it, on the thread it is made
// on: the handlers make one around every call, and each of XLA's threads that runs tasks
// of a call (workers.h) one around its tasks. Elsewhere it does nothing.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
#include <xmmintrin.h>
#define JAXBIND_FLOATS_X86 1
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define JAXBIND_FLOATS_ARM64 1
#endif

namespace jaxbind {

class IeeeFloats {
 public:
#if defined(JAXBIND_FLOATS_X86)
  static constexpr unsigned kFlush = 0x8000u | 0x0040u;  // FTZ | DAZ
  IeeeFloats() : saved_(_mm_getcsr()) {
    if (saved_ & kFlush) _mm_setcsr(saved_ & ~kFlush);
  }
  ~IeeeFloats() {
    if (saved_ & kFlush) _mm_setcsr(saved_);
  }

 private:
  unsigned saved_;
#elif defined(JAXBIND_FLOATS_ARM64)
  static constexpr uint64_t kFlush = (uint64_t{1} << 24) | (uint64_t{1} << 19);  // FZ | FZ16
  IeeeFloats() {
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved_));
    if (saved_ & kFlush) {
      uint64_t ieee = saved_ & ~kFlush;
      __asm__ __volatile__("msr fpcr, %0" : : "r"(ieee));
    }
  }
  ~IeeeFloats() {
    if (saved_ & kFlush) __asm__ __volatile__("msr fpcr, %0" : : "r"(saved_));
  }

 private:
  uint64_t saved_;
#else
  IeeeFloats() {}
#endif
 public:
  IeeeFloats(const IeeeFloats &) = delete;
  IeeeFloats &operator=(const IeeeFloats &) = delete;
};

}  // namespace jaxbind
