// jaxbind's trampoline: the opt-in check that a body wrote every element of its outputs
// (JAXBIND_CHECK_OUTPUTS=1 in the environment, or jaxbind.check_outputs(True)). Off, a
// call pays one relaxed atomic load. On, every output of a CPU call that shares no
// input's memory is filled with a pattern before its body runs, once for the whole call
// (a batch included), and an element of which any part still holds the pattern afterwards
// fails the call with a message that names the output. A complex number is two parts, its
// real and imaginary halves, and either one left unwritten is reported; every other type
// checked is one part (bf16 and f16 included). The patterns: for floats (and each half of
// a complex number) a quiet NaN whose payload arithmetic does not make (x86 and Arm make
// the default NaN, and an operation on NaNs keeps an operand's payload), so a body that
// computes NaN, in one half or both, passes; only copying the pattern's bits from
// somewhere (an input that holds them) writes it. For integers the bytes 0xA5: a body that
// writes exactly that value (-91 in int8) is reported too. For bools 0xA5, which is no
// bool (a bool is 0 or 1), so a correct body never writes it. Float8 and 4-bit types are
// not checked. Nothing here touches Python.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "call.h"

// The extension is built for size (-Os, nanobind's default), which leaves the loops below
// scalar; GCC takes a per-function request to vectorize them (clang vectorizes at -Os).
#if defined(__GNUC__) && !defined(__clang__)
#define JAXBIND_VECTORIZED __attribute__((optimize("O3")))
#else
#define JAXBIND_VECTORIZED
#endif

namespace jaxbind {

inline std::atomic<bool> check_outputs{false};

class Unwritten {
 public:
  // Fill the outputs of `call` (the whole call) with their patterns.
  static void fill(const Call &call) {
    for (const Buffer &out : call.outs) {
      Kind kind = kind_of(out);
      if (checked(call, out, kind)) fill_units(out, kind);
    }
  }

  // After the body: a LabelledError, prefixed with `label`, for the first output with
  // an element of which a part still holds its pattern.
  static void check(const Call &call, const std::string &label) {
    for (size_t k = 0; k < call.outs.size(); ++k) {
      const Buffer &out = call.outs[k];
      Kind kind = kind_of(out);
      if (!checked(call, out, kind)) continue;
      int64_t first = -1;
      int64_t left = count(out, kind, first);
      if (left == 0) continue;
      std::string shape;
      for (int64_t d = 0; d < out.rank; ++d) shape += (d ? "," : "") + std::to_string(out.dims[d]);
      throw LabelledError(
          label + ": the body left " + std::to_string(left) + " of " +
          std::to_string(elements(out)) + " elements of output " + std::to_string(k) + " (" +
          kind.name + "[" + shape + "]) unwritten, the first at flat index " +
          std::to_string(first) +
          ": it must write every element of every output (jaxbind.check_outputs, or "
          "JAXBIND_CHECK_OUTPUTS=1, filled the outputs with " +
          (kind.is_float ? "NaN" : "the bytes 0xA5") + " before the call)");
    }
  }

 private:
  // An element type's pattern: `units` repetitions of `unit` (of `width` bytes) make
  // one element.
  struct Kind {
    const char *name = nullptr;  // nullptr: not checked
    int width = 0, units = 1;
    uint64_t unit = 0;
    bool is_float = false;
  };

  static Kind kind_of(const Buffer &b) {
    constexpr uint64_t bytes = 0xA5A5A5A5A5A5A5A5ull;
    static const std::pair<int64_t, Kind> kinds[] = {
        {JAXBIND_BOOL, {"bool", 1, 1, bytes}},
        {JAXBIND_INT8, {"int8", 1, 1, bytes}},
        {JAXBIND_UINT8, {"uint8", 1, 1, bytes}},
        {JAXBIND_INT16, {"int16", 2, 1, bytes}},
        {JAXBIND_UINT16, {"uint16", 2, 1, bytes}},
        {JAXBIND_INT32, {"int32", 4, 1, bytes}},
        {JAXBIND_UINT32, {"uint32", 4, 1, bytes}},
        {JAXBIND_INT64, {"int64", 8, 1, bytes}},
        {JAXBIND_UINT64, {"uint64", 8, 1, bytes}},
        {JAXBIND_FLOAT16, {"float16", 2, 1, 0x7EA5, true}},
        {JAXBIND_BFLOAT16, {"bfloat16", 2, 1, 0x7FE5, true}},
        {JAXBIND_FLOAT32, {"float32", 4, 1, 0x7FE5A5A5, true}},
        {JAXBIND_FLOAT64, {"float64", 8, 1, 0x7FFCA5A5A5A5A5A5ull, true}},
        {JAXBIND_COMPLEX64, {"complex64", 4, 2, 0x7FE5A5A5, true}},
        {JAXBIND_COMPLEX128, {"complex128", 8, 2, 0x7FFCA5A5A5A5A5A5ull, true}},
    };
    for (const auto &[dtype, kind] : kinds)
      if (dtype == b.dtype) return kind;
    return {};
  }

  static int64_t elements(const Buffer &b) {
    int64_t n = 1;
    for (int64_t d = 0; d < b.rank; ++d) n *= b.dims[d];
    return n;
  }

  // Checked: a type with a pattern, some elements, and no input's memory (an aliased
  // output holds the input's values when the body starts).
  static bool checked(const Call &call, const Buffer &out, const Kind &kind) {
    if (kind.name == nullptr || out.data == nullptr || elements(out) == 0) return false;
    return std::none_of(call.ins.begin(), call.ins.end(),
                        [&](const Buffer &in) { return in.data == out.data; });
  }

  template <typename U>
  JAXBIND_VECTORIZED static void fill_as(const Buffer &b, const Kind &kind) {
    U *p = static_cast<U *>(b.data);
    std::fill(p, p + elements(b) * kind.units, static_cast<U>(kind.unit));
  }

  static void fill_units(const Buffer &b, const Kind &kind) {
    switch (kind.width) {
      case 1:
        return fill_as<uint8_t>(b, kind);
      case 2:
        return fill_as<uint16_t>(b, kind);
      case 4:
        return fill_as<uint32_t>(b, kind);
      default:
        return fill_as<uint64_t>(b, kind);
    }
  }

  // The elements of which a part holds the pattern, and the first of them (a second
  // pass, only when there is one: the first is a loop the compiler vectorizes).
  template <typename U, int units>
  JAXBIND_VECTORIZED static int64_t count_as(const Buffer &b, const Kind &kind, int64_t &first) {
    const U *p = static_cast<const U *>(b.data);
    const U unit = static_cast<U>(kind.unit);
    const int64_t n = elements(b);
    auto same = [&](int64_t e) {
      if constexpr (units == 1)
        return p[e] == unit;
      else  // either half (real, imaginary) left unwritten
        return (p[2 * e] == unit) | (p[2 * e + 1] == unit);
    };
    int64_t left = 0;
    for (int64_t e = 0; e < n; ++e) left += same(e);
    for (int64_t e = 0; left > 0 && e < n; ++e)
      if (same(e)) {
        first = e;
        break;
      }
    return left;
  }

  static int64_t count(const Buffer &b, const Kind &kind, int64_t &first) {
    bool pairs = kind.units == 2;
    switch (kind.width) {
      case 1:
        return count_as<uint8_t, 1>(b, kind, first);
      case 2:
        return count_as<uint16_t, 1>(b, kind, first);
      case 4:
        return pairs ? count_as<uint32_t, 2>(b, kind, first)
                     : count_as<uint32_t, 1>(b, kind, first);
      default:
        return pairs ? count_as<uint64_t, 2>(b, kind, first)
                     : count_as<uint64_t, 1>(b, kind, first);
    }
  }
};

}  // namespace jaxbind
