// jaxbind's trampoline and C runtime: a state's cell, where every call of the op takes an
// object under the state's concurrency policy, without the GIL (see state.h for the whole
// picture). Nothing here touches Python.
//
// Each state has one `StateCell` (in Python, each `StateObjects` of jaxbind/_runtime/
// state.py; in the C runtime, each C state of a bundle), which holds its policy and, for
// each object (a slot), the address a kernel gets (jaxbind_call::state). Its `Provider`
// makes the objects and gives their addresses: Python's state (state_python.h, the GIL
// taken only then), or the C runtime's C setup.
//   "lock"    one object; a mutex around each use.
//   "pool"    up to pool_size objects, made when a call finds none idle; each used by
//             one call at a time (state_pool.h).
//   "shared"  one object, used by every call at once; only counted.
// The policies' names are defined here alone (kPolicies; Python reads them as
// jaxbind._ext.state_policies).
//
// A call never waits for an object while its own thread holds one of the same cell (a
// body that calls its own op runs the nested call on its thread): under "lock" such a call
// fails at once, with an error naming the op and the fix (ReentrantUse); under "pool" it
// takes an idle or new object if the pool has one, and fails otherwise.
//
// The owner closes the cell before the objects' teardown: `close` waits for the calls
// using an object, and a call that comes later fails instead of reaching a torn-down
// object.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "call.h"
#include "counted.h"
#include "state_pool.h"

namespace jaxbind {

// The concurrency policies, in the order of their codes.
enum class Policy : int { kLock, kPool, kShared };
inline constexpr const char *kPolicies[] = {"lock", "pool", "shared"};

inline Policy policy_named(const std::string &name) {
  std::string known;
  for (size_t k = 0; k < std::size(kPolicies); ++k) {
    if (name == kPolicies[k]) return static_cast<Policy>(k);
    known += std::string(k ? ", '" : "'") + kPolicies[k] + "'";
  }
  throw std::invalid_argument("unknown concurrency policy '" + name + "' (one of " + known + ")");
}

// A call found its state's cell closed: the state was freed meanwhile (a key value's
// state, dropped from Python's last few, is set up again).
struct StateFreed : LabelledError {
  using LabelledError::LabelledError;
};

// A call that would wait for an object its own thread holds (see the top of this file);
// Python bodies get it as jaxbind._ext.ReentrantUse (a RuntimeError), whose message is
// the whole report.
struct ReentrantUse : LabelledError {
  using LabelledError::LabelledError;
};

// Nothing to do while a call waits (a thread without the GIL); Python bodies release the
// GIL instead (state_python.h).
struct NothingHeld {};

class StateCell {
 public:
  std::atomic<int> refs{0};  // see CellRef

  // What makes a slot's object and gives its address, asked without the cell's locks
  // (but for the slot, which the asking call holds; "shared" and "lock" ask for slot 0,
  // made at most once, which a provider may make when first asked).
  struct Provider {
    virtual ~Provider() = default;
    // The object of `slot` made (`make`: a pool's empty slot) and its address: false if
    // the provider's state is gone (the call fails: freed). Throws LabelledError.
    virtual bool provide(int slot, bool make, void *&address) = 0;
  };

  // `label` names the op and role, `state` the state's setup, for messages.
  StateCell(const std::string &policy, int size, std::unique_ptr<Provider> provider,
            std::string label, std::string state = "")
      : policy_(policy_named(policy)),
        addresses_(static_cast<size_t>(size < 1 ? 1 : size)),
        pool_(policy_ == Policy::kPool ? addresses_.size() : 0),
        provider_(std::move(provider)),
        label_(std::move(label)),
        state_(std::move(state)) {}

  bool closed() const { return closed_.load(std::memory_order_acquire); }

  // --- Kernels (no GIL, no Python) ---

  // Take an object for one kernel call: its slot, for `release`. Waits under "lock" and
  // "pool"; makes an object (the GIL taken) for a pool with none idle and room for one.
  // Throws LabelledError if the state was freed or the setup of a new object failed.
  int enter() {
    if (policy_ == Policy::kShared) return share();
    if (policy_ == Policy::kLock) return lock();
    PoolSlots::Taken taken = take();
    if (taken.outcome == PoolSlots::kMake) {
      try {
        ask(taken.slot, true);
      } catch (...) {
        pool_.abandon(taken.slot);
        throw;
      }
    }
    return taken.slot;
  }

  void release(int slot) {
    if (policy_ == Policy::kShared) {
      users_.fetch_sub(1, std::memory_order_seq_cst);
    } else if (policy_ == Policy::kLock) {
      holder_.store(std::thread::id(), std::memory_order_relaxed);
      mu_.unlock();
    } else {
      pool_.give_back(slot);
    }
  }

  // The address of a slot's object, asked of the provider the first time.
  void *address(int slot) {
    Address &a = addresses_[slot];
    if (a.known.load(std::memory_order_acquire)) return a.address;
    return ask(slot, false);
  }

  // --- Bodies that make their objects themselves (Python's, the GIL held) ---

  // (slot, new): an object for one call; `new`: the caller makes it (or abandons the
  // slot). A `WhileWaiting` is held while the call may wait (the GIL released).
  template <class WhileWaiting>
  std::pair<int, bool> acquire() {
    if (policy_ == Policy::kShared) return {share(), false};
    if (policy_ == Policy::kLock) {
      if (mu_.try_lock()) return {locked(), false};
      [[maybe_unused]] WhileWaiting waiting;
      return {lock(), false};
    }
    [[maybe_unused]] WhileWaiting waiting;
    PoolSlots::Taken taken = take();
    return {taken.slot, taken.outcome == PoolSlots::kMake};
  }

  // A slot whose object could not be made: empty again.
  void abandon(int slot) { pool_.abandon(slot); }

  void set_address(int slot, uintptr_t address) {
    addresses_[slot].address = reinterpret_cast<void *>(address);
    addresses_[slot].known.store(true, std::memory_order_release);
  }

  // No object is used after this returns: waits (holding a `WhileWaiting`) for the calls
  // using one; later calls fail. Returns the provider: the owner may tear its objects
  // down.
  template <class WhileWaiting>
  std::unique_ptr<Provider> close() {
    {
      [[maybe_unused]] WhileWaiting waiting;
      if (policy_ == Policy::kShared) {
        closed_.store(true, std::memory_order_seq_cst);
        while (users_.load(std::memory_order_seq_cst) > 0)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else if (policy_ == Policy::kLock) {
        std::lock_guard lock(mu_);
        closed_.store(true, std::memory_order_relaxed);
      } else {
        closed_.store(true, std::memory_order_release);
        pool_.close();
      }
    }
    return std::move(provider_);
  }

 private:
  struct Address {
    void *address = nullptr;
    std::atomic<bool> known{false};
  };

  // "shared": counted as a user, unless the cell was closed.
  int share() {
    users_.fetch_add(1, std::memory_order_seq_cst);
    if (closed_.load(std::memory_order_seq_cst)) {
      users_.fetch_sub(1, std::memory_order_seq_cst);
      throw freed();
    }
    return 0;
  }

  // "lock": the mutex taken (waiting), unless this thread holds it already.
  int lock() {
    if (!mu_.try_lock()) {
      if (holder_.load(std::memory_order_relaxed) == std::this_thread::get_id()) throw reentrant();
      mu_.lock();
    }
    return locked();
  }

  // The lock taken (by this thread): slot 0, or freed() if the cell was closed meanwhile.
  int locked() {
    if (closed_.load(std::memory_order_relaxed)) {
      mu_.unlock();
      throw freed();
    }
    holder_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    return 0;
  }

  // "pool": a slot taken (waiting), or the error of a closed pool or of a nested call.
  PoolSlots::Taken take() {
    PoolSlots::Taken taken = pool_.take();
    if (taken.outcome == PoolSlots::kClosed) throw freed();
    if (taken.outcome == PoolSlots::kMine) throw reentrant();
    return taken;
  }

  // The provider's object of the slot (made, if `make`), and its address.
  void *ask(int slot, bool make) {
    void *address = nullptr;
    if (!provider_->provide(slot, make, address)) throw freed();
    set_address(slot, reinterpret_cast<uintptr_t>(address));
    return address;
  }

  StateFreed freed() const {
    return StateFreed(label_ +
                      ": its state was freed while a call still ran (its executable was "
                      "freed); call the program again");
  }

  ReentrantUse reentrant() const {
    std::string state = state_.empty() ? "its state" : "its state '" + state_ + "'";
    if (policy_ == Policy::kLock)
      return ReentrantUse(
          label_ + ": called again on a thread whose call of the op holds " + state +
          " (concurrency=\"lock\": one call at a time), so it would wait for itself forever. "
          "Use concurrency=\"pool\" (a nested call gets an object of its own) or "
          "\"shared\" (one thread-safe object), or do not call the op inside its own body");
    return ReentrantUse(label_ + ": called again on a thread whose call of the op holds an " +
                        "object of " + state + ", and all " + std::to_string(addresses_.size()) +
                        " objects of its pool are in use, so it would wait for one that may "
                        "never be given back. Raise pool_size to the depth of the nested "
                        "calls (plus the threads that call the op at once), or use "
                        "concurrency=\"shared\"");
  }

  const Policy policy_;
  std::vector<Address> addresses_;      // each slot's object's, once known
  PoolSlots pool_;                      // "pool"
  std::unique_ptr<Provider> provider_;  // until `close`
  std::string label_;
  std::string state_;                      // the state's setup's name
  std::mutex mu_;                          // "lock"
  std::atomic<std::thread::id> holder_{};  // "lock": the thread holding mu_ (none: id())
  std::atomic<int64_t> users_{0};          // "shared"
  std::atomic<bool> closed_{false};
};

// A counted reference to a StateCell (counted.h).
using CellRef = Counted<StateCell>;

}  // namespace jaxbind
