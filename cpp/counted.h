// jaxbind's trampoline and C runtime: counted references to objects that the last one
// frees, on any thread. Nothing here touches Python.
#pragma once

#include <atomic>
#include <utility>

namespace jaxbind {

// A counted reference to anything with a `refs` count: a site's core (CoreRef), an
// Instance (InstanceRef), a state's cell (CellRef). Not std::shared_ptr: libstdc++'s
// reference counts read glibc's __libc_single_threaded (glibc 2.32), newer than the
// manylinux_2_28 wheel may need.
template <typename T>
class Counted {
 public:
  Counted() = default;
  explicit Counted(T *held) : held_(held) {
    if (held_) held_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  Counted(const Counted &other) : Counted(other.held_) {}
  Counted(Counted &&other) noexcept : held_(other.held_) { other.held_ = nullptr; }
  Counted &operator=(Counted other) noexcept {
    std::swap(held_, other.held_);
    return *this;
  }
  ~Counted() {
    if (held_ && held_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete held_;
  }
  T *get() const { return held_; }
  T &operator*() const { return *held_; }
  T *operator->() const { return held_; }
  explicit operator bool() const { return held_ != nullptr; }
  bool operator==(const Counted &other) const { return held_ == other.held_; }

 private:
  T *held_ = nullptr;
};
}  // namespace jaxbind
