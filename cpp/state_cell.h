// jaxbind's trampoline: a state's cell, where every call of the op takes an object under
// the state's concurrency policy, without the GIL (see state.h for the whole picture).
//
// Each `StateObjects` (jaxbind/_runtime/state.py) has one `StateCell`, which holds its
// policy and, for each object (a slot), the address a kernel gets (jaxbind_call::state):
//   "lock"    one object; a mutex around each use.
//   "pool"    up to pool_size objects, made when a call finds none idle (the GIL taken
//             only then, to make one); each used by one call at a time (state_pool.h).
//   "shared"  one object, used by every call at once; only counted.
// The policies' names are defined here alone (kPolicies; Python reads them as
// jaxbind._ext.state_policies).
//
// A call never waits for an object while its own thread holds one of the same cell (a
// body that calls its own op runs the nested call on its thread): under "lock" such a call
// fails at once, with an error naming the op and the fix (ReentrantUse); under "pool" it
// takes an idle or new object if the pool has one, and fails otherwise.
//
// Python closes the cell before the objects' teardown: `close` waits for the calls using
// an object, and a call that comes later fails instead of reaching a torn-down object.
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

#include <nanobind/nanobind.h>

#include "call.h"
#include "held.h"
#include "state_pool.h"

namespace jaxbind {

namespace nb = nanobind;

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

class StateCell {
 public:
  std::atomic<int> refs{0};  // see CellRef

  // `owner`: the Python state (held weakly), whose provide(slot, make) makes the object
  // of a slot (make) and gives its address. `label` names the op and role, `state` the
  // state's setup, for messages.
  StateCell(const std::string &policy, int size, nb::handle owner, std::string label,
            std::string state = "")
      : policy_(policy_named(policy)),
        addresses_(static_cast<size_t>(size < 1 ? 1 : size)),
        pool_(policy_ == Policy::kPool ? addresses_.size() : 0),
        owner_(owner),
        label_(std::move(label)),
        state_(std::move(state)) {}

  bool closed() const { return closed_.load(std::memory_order_acquire); }

  // --- Kernels (no GIL) ---

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

  // The address of a slot's object, asked of Python (the GIL taken) the first time.
  void *address(int slot) {
    Address &a = addresses_[slot];
    if (a.known.load(std::memory_order_acquire)) return a.address;
    return ask(slot, false);
  }

  // --- Python (the GIL held) ---

  // (slot, new): an object for a Python body; `new`: the caller makes it (or abandons
  // the slot). Waits without the GIL.
  std::pair<int, bool> acquire() {
    try {
      if (policy_ == Policy::kShared) return {share(), false};
      if (policy_ == Policy::kLock) {
        if (mu_.try_lock()) return {locked(), false};
        nb::gil_scoped_release release;
        return {lock(), false};
      }
      nb::gil_scoped_release release;
      PoolSlots::Taken taken = take();
      return {taken.slot, taken.outcome == PoolSlots::kMake};
    } catch (ReentrantUse &e) {  // (its own Python type: see jaxbind_ext.cc)
      throw ReentrantUse(std::string("jaxbind: ") + e.what());
    } catch (LabelledError &e) {
      throw std::runtime_error(std::string("jaxbind: ") + e.what());
    }
  }

  // A slot whose object could not be made: empty again.
  void abandon(int slot) { pool_.abandon(slot); }

  void set_address(int slot, uintptr_t address) {
    addresses_[slot].address = reinterpret_cast<void *>(address);
    addresses_[slot].known.store(true, std::memory_order_release);
  }

  // No object is used after this returns: waits (without the GIL) for the calls using
  // one; later calls fail. Then the owner may tear its objects down.
  void close() {
    {
      nb::gil_scoped_release release;
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
    owner_.reset();
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

  // Python's provide(slot, make): the slot's object made (make) and its address.
  void *ask(int slot, bool make) {
    uintptr_t address = 0;
    bool asked = owner_.ask([&](nb::handle owner) {
      address = nb::cast<uintptr_t>(owner.attr("provide")(slot, make));
    });
    if (!asked) throw freed();
    set_address(slot, address);
    return reinterpret_cast<void *>(address);
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
  std::vector<Address> addresses_;  // each slot's object's, once known
  PoolSlots pool_;                  // "pool"
  WeakOwner owner_;                 // the Python state
  std::string label_;
  std::string state_;                      // the state's setup's name
  std::mutex mu_;                          // "lock"
  std::atomic<std::thread::id> holder_{};  // "lock": the thread holding mu_ (none: id())
  std::atomic<int64_t> users_{0};          // "shared"
  std::atomic<bool> closed_{false};
};

// A counted reference to a StateCell (as CoreRef is to a SiteCore).
class CellRef {
 public:
  CellRef() = default;
  explicit CellRef(StateCell *cell) : cell_(cell) {
    if (cell_) cell_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  CellRef(const CellRef &other) : CellRef(other.cell_) {}
  CellRef(CellRef &&other) noexcept : cell_(other.cell_) { other.cell_ = nullptr; }
  CellRef &operator=(CellRef other) noexcept {
    std::swap(cell_, other.cell_);
    return *this;
  }
  ~CellRef() {
    if (cell_ && cell_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete cell_;
  }
  StateCell *get() const { return cell_; }
  StateCell *operator->() const { return cell_; }
  explicit operator bool() const { return cell_ != nullptr; }

 private:
  StateCell *cell_ = nullptr;
};

// What Python holds of a cell (jaxbind._ext.StateCell).
struct CellHandle {
  CellRef cell;
};

}  // namespace jaxbind
