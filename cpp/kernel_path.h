// jaxbind's trampoline and C runtime: a compiled kernel's call once its site and
// signature are known, without the GIL and without Python (the trampoline's CPU handler,
// handlers.h, and the C runtime's handler, cpp/runtime/, run it alike): the thread's call
// frames, the kernel run once or per batch element, inside errors.h's boundary.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "call.h"
#include "errors.h"
#include "kernels.h"
#include "outputs.h"
#include "site_core.h"
#include "workers.h"

namespace jaxbind {

// What one call works on, reused by the calls of a thread (no allocation per call once
// warm): the call's buffers, a batch element's, and the instance found last where no
// slot keeps one. A stack, because a Python callable may call a jaxbind op eagerly,
// which runs on the same thread.
struct Frame {
  Call call, element;
  Kept kept;
};

class ScopedFrame {
 public:
  ScopedFrame() {
    Stack &stack = local();
    if (stack.depth == stack.frames.size()) stack.frames.push_back(std::make_unique<Frame>());
    frame_ = stack.frames[stack.depth++].get();
  }
  ~ScopedFrame() { --local().depth; }
  ScopedFrame(const ScopedFrame &) = delete;
  ScopedFrame &operator=(const ScopedFrame &) = delete;
  Frame &operator*() const { return *frame_; }
  Frame *operator->() const { return frame_; }

 private:
  struct Stack {
    std::vector<std::unique_ptr<Frame>> frames;
    size_t depth = 0;
  };
  static Stack &local() {
    thread_local Stack stack;
    return stack;
  }
  Frame *frame_;
};

// Run a kernel site's call: once, or once per batch element (on several of XLA's threads
// when that pays), without the GIL.
inline void run_kernel(const SiteCore &core, jaxbind_kernel_fn fn, Frame &frame,
                       ExecutionContext context) {
  const Loop *batch = core.whole_batch ? &core.loop : nullptr;
  Workers workers(context, core.kernel.threads);
  const bool checking = check_outputs.load(std::memory_order_relaxed);
  if (checking) Unwritten::fill(frame.call);
  core.loop.run(frame.call, core.whole_batch, frame.element, workers,
                [&](const Call &call, const Workers &w) {
                  call_kernel(fn, core.kernel, core.label, call, batch, w);
                });
  if (checking) Unwritten::check(frame.call, core.label);
}

// The live core of a kernel site for `on_cuda` calls (a kernel for CUDA, or for the CPU)
// whose call decodes into `frame` and whose signature it accepted before, with the
// kernel's address in `fn`: no GIL, no Python object. nullptr when the call needs the
// slow path (the trampoline's `guarded`, handlers.h; the C runtime's refusal), which
// reports what went wrong with the binding's name.
inline SiteCore *accepted_kernel(Instance &instance, const ffi::RemainingArgs &args,
                                 const ffi::RemainingRets &rets, Frame &frame, bool on_cuda,
                                 jaxbind_kernel_fn &fn) {
  SiteCore *core = live_core(instance);
  if (core == nullptr || !core->is_kernel || core->kernel.on_cuda != on_cuda) return nullptr;
  try {
    frame.call.decode(args, rets);
  } catch (std::exception &) {
    return nullptr;
  }
  return accepted_before(*core, frame.call, fn) ? core : nullptr;
}

// A CPU kernel call whose site and signature are known: no GIL, no Python object.
// Returns false when the call needs the slow path. No Python exception reaches it:
// native_boundary.
inline bool run_kernel_fast(Instance &instance, const ffi::RemainingArgs &args,
                            const ffi::RemainingRets &rets, ExecutionContext context, Frame &frame,
                            ffi::Error &result) {
  jaxbind_kernel_fn fn = nullptr;
  SiteCore *core = accepted_kernel(instance, args, rets, frame, false, fn);
  if (core == nullptr) return false;
  result =
      native_boundary(Where::of_label(core->label), [&] { run_kernel(*core, fn, frame, context); });
  return true;
}

// Calls of kernels for CUDA in this process (jaxbind._ext.stream_kernel_calls), one per
// batch element: a call XLA replays from a CUDA graph makes none.
inline std::atomic<int64_t> stream_kernel_calls{0};

// A kernel for CUDA (jaxbind.kernel(platform="cuda")): a host function called on the
// calling thread with XLA's stream and the device, once or once per batch element, in
// order (it enqueues its work on the stream). Nothing here reads the buffers: they are
// device memory.
inline void run_stream_kernel(const SiteCore &core, jaxbind_kernel_fn fn, Frame &frame,
                              const Place &place) {
  const Loop *batch = core.whole_batch ? &core.loop : nullptr;
  core.loop.run(frame.call, core.whole_batch, frame.element, serial_workers,
                [&](const Call &call, const Workers &w) {
                  call_kernel(fn, core.kernel, core.label, call, batch, w, place);
                  stream_kernel_calls.fetch_add(1, std::memory_order_relaxed);
                });
}

// Such a call whose site and signature are known: no GIL, no Python object (but a
// device's first call of an op with a state, which sets it up). Returns false when the
// call needs the GIL path.
inline bool run_stream_kernel_fast(Instance &instance, const ffi::RemainingArgs &args,
                                   const ffi::RemainingRets &rets, Frame &frame, const Place &place,
                                   ffi::Error &result) {
  jaxbind_kernel_fn fn = nullptr;
  SiteCore *core = accepted_kernel(instance, args, rets, frame, true, fn);
  if (core == nullptr) return false;
  result = native_boundary(Where::of_label(core->label),
                           [&] { run_stream_kernel(*core, fn, frame, place); });
  return true;
}

}  // namespace jaxbind
