// jaxbind's trampoline: XLA's intra-op thread pool, as kernels and the batch loop use it.
// Nothing here touches Python.
//
// XLA's FFI lends a CPU handler the pool that runs XLA's own compute (through the call's
// ExecutionContext). `Workers` runs n independent tasks on it: the
// calling thread takes tasks too, and up to threads - 1 helpers are scheduled on the
// pool; every thread takes the next task from one counter until none is left. The caller
// waits only for tasks that a thread has taken, which are running: a helper that XLA
// starts late (its pool busy, or of size 1) finds no task left and returns, touching
// only the shared `Job`, which it keeps alive. So nothing waits on a helper that never
// started, and nested use (a parallel kernel in a parallel batch loop) cannot deadlock.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "floats.h"
#include "jaxbind/kernel.h"
#include "xla_ffi.h"

namespace jaxbind {

class Workers {
 public:
  Workers() = default;  // no pool: every task on the calling thread
  // At most `limit` threads of `pool` (0: all of them).
  Workers(ExecutionContext pool, int64_t limit) : pool_(pool), limit_(limit) {}

  // The same pool, at most `limit` threads.
  Workers limited(int64_t limit) const {
    Workers w = *this;
    w.limit_ = std::max<int64_t>(1, limit);
    w.threads_ = std::min(threads(), w.limit_);
    return w;
  }

  // The threads tasks may run on, the calling thread included (at least 1). XLA is asked
  // once per process: its CPU client has one intra-op pool. (Were there another, of
  // another size, only the number of tasks kernels make would be off, not a result.) The
  // owner's first use comes before any task runs, so no two threads race on threads_.
  int64_t threads() const {
    if (threads_ == 0) {
      static std::atomic<int64_t> known{0};
      int64_t n =
          pool_.api != nullptr && pool_.ctx != nullptr ? known.load(std::memory_order_relaxed) : 1;
      if (n == 0) {
        XLA_FFI_ThreadPool_NumThreads_Args args{};
        args.struct_size = XLA_FFI_ThreadPool_NumThreads_Args_STRUCT_SIZE;
        args.ctx = pool_.ctx;
        args.num_threads = &n;
        if (XLA_FFI_Error *error = pool_.api->XLA_FFI_ThreadPool_NumThreads(&args)) {
          destroy_error(pool_.api, error);
          n = 0;
        }
        n = std::max<int64_t>(n, 1);
        known.store(n, std::memory_order_relaxed);
      }
      threads_ = limit_ > 0 ? std::min(n, limit_) : n;
    }
    return threads_;
  }

  // Run task(context, k) for every k in [0, n), and return when all have returned: 0, or
  // the first nonzero status (the tasks no thread had taken yet are then skipped).
  int32_t run(int64_t n, jaxbind_task_fn task, void *context) const {
    if (n <= 0) return 0;
    int64_t helpers = std::min(n, threads()) - 1;
    if (helpers == 0) {
      for (int64_t k = 0; k < n; ++k)
        if (int32_t status = task(context, k)) return status;
      return 0;
    }
    Job *job = new Job(n, task, context);
    job->refs.store(2 + helpers, std::memory_order_relaxed);  // the caller's two, and each
    for (int64_t h = 0; h < helpers; ++h) schedule(job);      // helper's
    job->work();
    job->wait();
    int32_t status = job->status.load(std::memory_order_acquire);
    job->release();  // (the caller held two: one for work, one for wait)
    job->release();
    return status;
  }

  // Run body(k) for every k in [0, n), for C++ bodies: the first exception a body threw is
  // thrown here, after every task taken has returned.
  template <typename Body>
  void run(int64_t n, Body &&body) const {
    struct Context {
      Body *body;
      std::mutex mu;
      std::exception_ptr failed;
    } context{&body, {}, nullptr};
    run(
        n,
        [](void *data, int64_t k) -> int32_t {
          auto *c = static_cast<Context *>(data);
          try {
            (*c->body)(k);
            return 0;
          } catch (...) {
            std::lock_guard lock(c->mu);
            if (!c->failed) c->failed = std::current_exception();
            return 1;
          }
        },
        &context);
    if (context.failed) std::rethrow_exception(context.failed);
  }

 private:
  // One run: shared by the caller and its helpers, freed by the last of them.
  struct Job {
    Job(int64_t n, jaxbind_task_fn task, void *context) : n(n), task(task), context(context) {}
    const int64_t n;
    const jaxbind_task_fn task;
    void *const context;  // the caller's: touched only for a task taken
    std::atomic<int64_t> next{0}, done{0};
    std::atomic<int32_t> status{0};
    std::atomic<int64_t> refs{0};
    std::mutex mu;
    std::condition_variable finished;

    void work() {
      IeeeFloats ieee;  // the body's floats on XLA's threads too (see floats.h)
      for (int64_t k; (k = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
        if (status.load(std::memory_order_relaxed) == 0) {
          int32_t s = task(context, k);
          int32_t zero = 0;
          if (s != 0) status.compare_exchange_strong(zero, s, std::memory_order_acq_rel);
        }
        if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
          std::lock_guard lock(mu);
          finished.notify_all();
        }
      }
    }

    void wait() {
      for (int spin = 0; spin < 64 && done.load(std::memory_order_acquire) < n; ++spin)
        std::this_thread::yield();
      std::unique_lock lock(mu);
      finished.wait(lock, [&] { return done.load(std::memory_order_acquire) == n; });
    }

    void release() {
      if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
    }
  };

  void schedule(Job *job) const {
    XLA_FFI_ThreadPool_Schedule_Args args{};
    args.struct_size = XLA_FFI_ThreadPool_Schedule_Args_STRUCT_SIZE;
    args.ctx = pool_.ctx;
    args.task = [](void *data) {
      auto *j = static_cast<Job *>(data);
      j->work();
      j->release();
    };
    args.data = job;
    if (XLA_FFI_Error *error = pool_.api->XLA_FFI_ThreadPool_Schedule(&args)) {
      destroy_error(pool_.api, error);  // no pool after all: the caller does the work
      job->release();
    }
  }

  ExecutionContext pool_;  // its pool
  int64_t limit_ = 0;
  mutable int64_t threads_ = 0;
};

// The ABI's parallel_for (jaxbind/kernel.h): the call's workers, or the calling thread.
inline int32_t parallel_for(const jaxbind_call *call, int64_t n_tasks, jaxbind_task_fn task,
                            void *context) {
  if (task == nullptr) return n_tasks > 0 ? -2 : 0;
  static const Workers serial;
  const auto *workers = call != nullptr && call->workers != nullptr
                            ? static_cast<const Workers *>(call->workers)
                            : &serial;
  return workers->run(n_tasks, task, context);
}

}  // namespace jaxbind
