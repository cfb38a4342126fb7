// jaxbind's trampoline: an op's state (see jaxbind/_runtime/state.py) as kernels reach
// it, without the GIL.
//
// A state's objects are Python objects, made and torn down by Python (`StateObjects`). Each
// `StateObjects` has one `StateCell`, which holds its concurrency policy and, for each object
// (a slot), the address a kernel gets (jaxbind_call::state):
//   "lock"    one object; a mutex around each use.
//   "pool"    up to pool_size objects, made when a call finds none idle (the GIL taken
//             only then, to make one); each used by one call at a time.
//   "shared"  one object, used by every call at once; only counted.
// Python bodies of the op take their objects through the same cell, so a kernel and a
// Python callable of one op never use one object at once under "lock" or "pool".
//
// A call never waits for an object while its own thread holds one of the same cell (a
// body that calls its own op, eagerly or through a jitted program, runs the nested call
// on its thread): the object it would wait for may be its own caller's, which is given
// back only when the nested call returns. Under "lock" such a call fails at once, with
// an error naming the op and the fix (ReentrantUse); under "pool" it takes an idle or
// new object if the pool has one, and fails otherwise. Kernels and Python bodies take
// objects through the same cell, so the rule holds for both; and with no such wait,
// nothing is left waiting for the interpreter's exit hook to wait on.
//
// A kernel site holds its cell counted (CellRef), and Python closes the cell before the
// objects' teardown: `close` waits for the calls using an object, and a call that comes
// later fails instead of reaching a torn-down object. A state with key= has a cell per
// key value: the site keeps the last few key values' bytes with their cells
// (`KeyedCells`), and asks Python (the GIL taken) only for a value it has not seen.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nanobind/nanobind.h>

#include "boundary.h"
#include "call.h"
#include "process.h"

namespace jaxbind {

namespace nb = nanobind;

// A Python object held by a C++ object that may be freed on a thread without the GIL
// (the last counted reference to a site's core or a cell can go on any thread): it takes
// the GIL to let go of the object; after the interpreter has begun to finalize it leaks
// it instead (Python must not be touched).
class HeldObject {
 public:
  HeldObject() = default;
  explicit HeldObject(nb::object obj) : ptr_(obj.release().ptr()) {}
  HeldObject(const HeldObject &) = delete;
  HeldObject &operator=(const HeldObject &) = delete;
  ~HeldObject() { reset(); }
  void reset() {
    PyObject *ptr = ptr_;
    ptr_ = nullptr;
    if (ptr == nullptr) return;
    PythonScope python;
    if (python.ready()) Py_DECREF(ptr);
  }
  // The object a weak reference refers to, or None (the GIL held).
  nb::object referent() const {
    if (ptr_ == nullptr) return nb::none();
    return nb::borrow(nb::handle(ptr_)());
  }

 private:
  PyObject *ptr_ = nullptr;
};

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
  enum Policy : int { kLock = 0, kPool = 1, kShared = 2 };
  std::atomic<int> refs{0};  // see CellRef

  // `owner`: the Python state (held weakly), whose provide(slot, make) makes the object
  // of a slot (make) and gives its address. Needs the GIL. `label` names the op and
  // role, `state` the state's setup, for messages.
  StateCell(int policy, int size, nb::handle owner, std::string label, std::string state = "")
      : policy_(policy),
        slots_(static_cast<size_t>(size < 1 ? 1 : size)),
        label_(std::move(label)),
        state_(std::move(state)) {
    if (policy < kLock || policy > kShared) throw std::invalid_argument("unknown policy");
    owner_ = std::make_unique<HeldObject>(nb::weakref(owner));
    if (policy_ != kPool) slots_[0].status = kIdle;  // made with the state (see StateObjects)
  }

  int policy() const { return policy_; }
  bool closed() const { return closed_.load(std::memory_order_acquire); }

  // --- Kernels (no GIL) ---

  // Take an object for one kernel call: its slot, for `release`. Waits under "lock" and
  // "pool"; makes an object (the GIL taken) for a pool with none idle and room for one.
  // Throws LabelledError if the state was freed or the setup of a new object failed.
  int enter() {
    if (policy_ == kShared) {
      users_.fetch_add(1, std::memory_order_seq_cst);
      if (closed_.load(std::memory_order_seq_cst)) {
        users_.fetch_sub(1, std::memory_order_seq_cst);
        throw freed();
      }
      return 0;
    }
    if (policy_ == kLock) {
      if (!mu_.try_lock()) {
        if (holder_.load(std::memory_order_relaxed) == std::this_thread::get_id())
          throw reentrant();
        mu_.lock();
      }
      return locked();
    }
    bool make = false;
    int slot = take(make);
    if (make) {
      try {
        ask(slot, true);
      } catch (...) {
        abandon(slot);
        throw;
      }
    }
    return slot;
  }

  void release(int slot) {
    if (policy_ == kShared) {
      users_.fetch_sub(1, std::memory_order_seq_cst);
    } else if (policy_ == kLock) {
      holder_.store(std::thread::id(), std::memory_order_relaxed);
      mu_.unlock();
    } else {
      {
        std::lock_guard lock(mu_);
        slots_[slot].status = kIdle;
      }
      changed_.notify_one();
    }
  }

  // The address of a slot's object, asked of Python (the GIL taken) the first time.
  void *address(int slot) {
    Slot &s = slots_[slot];
    if (s.known.load(std::memory_order_acquire)) return s.address;
    return ask(slot, false);
  }

  // --- Python (the GIL held) ---

  // (slot, new): an object for a Python body; `new`: the caller makes it (or abandons
  // the slot). Waits without the GIL.
  std::pair<int, bool> acquire() {
    if (policy_ == kShared) {
      users_.fetch_add(1, std::memory_order_seq_cst);
      if (closed_.load(std::memory_order_seq_cst)) {
        users_.fetch_sub(1, std::memory_order_seq_cst);
        throw std::runtime_error(std::string("jaxbind: ") + freed().what());
      }
      return {0, false};
    }
    try {
      if (policy_ == kLock) {
        if (!mu_.try_lock()) {
          if (holder_.load(std::memory_order_relaxed) == std::this_thread::get_id())
            throw reentrant();
          nb::gil_scoped_release release;
          mu_.lock();
        }
        return {locked(), false};
      }
      bool make = false;
      int slot;
      {
        nb::gil_scoped_release release;
        slot = take(make);
      }
      return {slot, make};
    } catch (ReentrantUse &e) {  // (its own Python type: see jaxbind_ext.cc)
      throw ReentrantUse(std::string("jaxbind: ") + e.what());
    } catch (LabelledError &e) {
      throw std::runtime_error(std::string("jaxbind: ") + e.what());
    }
  }

  // A slot whose object could not be made: empty again.
  void abandon(int slot) {
    {
      std::lock_guard lock(mu_);
      slots_[slot].status = kEmpty;
    }
    changed_.notify_all();
  }

  void set_address(int slot, uintptr_t address) {
    slots_[slot].address = reinterpret_cast<void *>(address);
    slots_[slot].known.store(true, std::memory_order_release);
  }

  // No object is used after this returns: waits (without the GIL) for the calls using
  // one; later calls fail. Then the owner may tear its objects down.
  void close() {
    {
      nb::gil_scoped_release release;
      if (policy_ == kShared) {
        closed_.store(true, std::memory_order_seq_cst);
        while (users_.load(std::memory_order_seq_cst) > 0)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else {
        std::unique_lock lock(mu_);
        closed_.store(true, std::memory_order_relaxed);
        if (policy_ == kPool) {
          changed_.notify_all();
          changed_.wait(lock, [&] {
            for (const Slot &s : slots_)
              if (s.status == kBusy || s.status == kMaking) return false;
            return true;
          });
        }
      }
    }
    owner_->reset();
  }

 private:
  enum Status : int { kEmpty, kMaking, kIdle, kBusy };
  struct Slot {
    int status = kEmpty;     // under mu_ ("pool")
    std::thread::id holder;  // the thread that took it (busy or making), under mu_
    void *address = nullptr;
    std::atomic<bool> known{false};
  };

  StateFreed freed() const {
    return StateFreed(label_ +
                      ": its state was freed while a call still ran (its executable was "
                      "freed); call the program again");
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

  ReentrantUse reentrant() const {
    std::string state = state_.empty() ? "its state" : "its state '" + state_ + "'";
    if (policy_ == kLock)
      return ReentrantUse(
          label_ + ": called again on a thread whose call of the op holds " + state +
          " (concurrency=\"lock\": one call at a time), so it would wait for itself forever. "
          "Use concurrency=\"pool\" (a nested call gets an object of its own) or "
          "\"shared\" (one thread-safe object), or do not call the op inside its own body");
    return ReentrantUse(label_ +
                        ": called again on a thread whose call of the op holds an "
                        "object of " +
                        state + ", and all " + std::to_string(slots_.size()) +
                        " objects of its pool are in use, so it would wait for one that may "
                        "never be given back. Raise pool_size to the depth of the nested "
                        "calls (plus the threads that call the op at once), or use "
                        "concurrency=\"shared\"");
  }

  // A pool's slot: an idle one, else an empty one to make (`make`), else wait; but a
  // thread that holds one of the slots already never waits (ReentrantUse).
  int take(bool &make) {
    const std::thread::id me = std::this_thread::get_id();
    std::unique_lock lock(mu_);
    for (;;) {
      if (closed_.load(std::memory_order_relaxed)) throw freed();
      int empty = -1;
      bool mine = false;
      for (size_t k = 0; k < slots_.size(); ++k) {
        Slot &s = slots_[k];
        if (s.status == kIdle) {
          s.status = kBusy;
          s.holder = me;
          return static_cast<int>(k);
        }
        if (s.status == kEmpty && empty < 0) empty = static_cast<int>(k);
        if ((s.status == kBusy || s.status == kMaking) && s.holder == me) mine = true;
      }
      if (empty >= 0) {
        slots_[empty].status = kMaking;
        slots_[empty].holder = me;
        make = true;
        return empty;
      }
      if (mine) throw reentrant();
      changed_.wait(lock);
    }
  }

  // Python's provide(slot, make): the slot's object made (make) and its address.
  void *ask(int slot, bool make) {
    PythonScope python;
    python.require();
    try {
      nb::object owner = owner_->referent();
      if (owner.is_none()) throw freed();
      auto address = nb::cast<uintptr_t>(owner.attr("provide")(slot, make));
      set_address(slot, address);
      if (make) {
        std::lock_guard lock(mu_);
        slots_[slot].status = kBusy;
      }
      return reinterpret_cast<void *>(address);
    } catch (nb::python_error &e) {
      throw python_failure(e);
    }
  }

  const int policy_;
  std::vector<Slot> slots_;
  std::string label_;
  std::string state_;                  // the state's setup's name
  std::unique_ptr<HeldObject> owner_;  // a weak reference
  std::mutex mu_;
  std::atomic<std::thread::id> holder_{};  // "lock": the thread holding mu_ (none: id())
  std::condition_variable changed_;
  std::atomic<bool> closed_{false};
  std::atomic<int64_t> users_{0};
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

// The cells of a state with key=, by the bytes of the call's key inputs: the last
// kKeys values, the most recently used last; Python's lease (held weakly) is asked for a
// value not among them, with the GIL.
class KeyedCells {
 public:
  static constexpr size_t kKeys = 4;

  KeyedCells(std::vector<int> inputs, nb::handle lease, std::string label)
      : inputs_(std::move(inputs)), label_(std::move(label)) {
    lease_ = std::make_unique<HeldObject>(nb::weakref(lease));
  }

  CellRef find(const Call &call) {
    for (int i : inputs_)
      if (i < 0 || static_cast<size_t>(i) >= call.ins.size())
        throw std::invalid_argument("the state's key input " + std::to_string(i) +
                                    " is not an input of the call");
    {
      std::lock_guard lock(mu_);
      for (size_t e = entries_.size(); e-- > 0;) {
        if (!matches(entries_[e], call)) continue;
        if (entries_[e].cell->closed()) {  // freed by Python's own choice: ask again
          entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(e));
          break;
        }
        if (e + 1 != entries_.size()) std::swap(entries_[e], entries_.back());
        return entries_.back().cell;
      }
    }
    CellRef cell = ask(call);
    Entry entry{{}, cell};
    for (int i : inputs_) {
      const Buffer &b = call.ins[i];
      Key key{b.dtype, std::vector<int64_t>(b.dims, b.dims + b.rank), {}};
      const char *data = static_cast<const char *>(b.data);
      key.bytes.assign(data, data + nbytes(b));
      entry.keys.push_back(std::move(key));
    }
    std::lock_guard lock(mu_);
    if (entries_.size() >= kKeys) entries_.erase(entries_.begin());
    entries_.push_back(std::move(entry));
    return cell;
  }

 private:
  struct Key {
    int64_t dtype;
    std::vector<int64_t> dims;
    std::vector<char> bytes;
  };
  struct Entry {
    std::vector<Key> keys;
    CellRef cell;
  };

  static size_t nbytes(const Buffer &b) {
    auto n = static_cast<size_t>(ffi::ByteWidth(static_cast<ffi::DataType>(b.dtype)));
    for (int64_t d = 0; d < b.rank; ++d) n *= static_cast<size_t>(b.dims[d]);
    return n;
  }

  bool matches(const Entry &entry, const Call &call) const {
    for (size_t k = 0; k < inputs_.size(); ++k) {
      const Buffer &b = call.ins[inputs_[k]];
      const Key &key = entry.keys[k];
      if (b.dtype != key.dtype || static_cast<size_t>(b.rank) != key.dims.size() ||
          !std::equal(key.dims.begin(), key.dims.end(), b.dims) ||
          std::memcmp(b.data, key.bytes.data(), key.bytes.size()) != 0)
        return false;
    }
    return true;
  }

  CellRef ask(const Call &call) {
    PythonScope python;
    python.require();
    try {
      nb::object lease = lease_->referent();
      if (lease.is_none()) throw LabelledError(label_ + ": its state was freed while a call ran");
      nb::list keys;
      for (int i : inputs_) {
        const Buffer &b = call.ins[i];
        nb::list shape;
        for (int64_t d = 0; d < b.rank; ++d) shape.append(b.dims[d]);
        keys.append(nb::make_tuple(reinterpret_cast<uintptr_t>(b.data), nb::tuple(shape),
                                   static_cast<int>(b.dtype)));
      }
      nb::object handle = lease.attr("cell_for")(nb::tuple(keys));
      return nb::cast<CellHandle &>(handle).cell;
    } catch (nb::python_error &e) {
      throw python_failure(e);
    }
  }

  std::vector<int> inputs_;
  std::string label_;
  std::unique_ptr<HeldObject> lease_;  // a weak reference
  std::mutex mu_;
  std::vector<Entry> entries_;
};

// A kernel site's state: a cell (no key), or the cells by key; none for an op without.
struct KernelState {
  CellRef cell;
  std::unique_ptr<KeyedCells> keyed;
  bool serial_tasks = false;  // its ranges share the call's object: run them in order

  explicit operator bool() const { return cell || keyed; }
};

// One kernel call's use of its site's state: the object taken under the policy for the
// call (and given back after), and its address.
class StateUse {
 public:
  StateUse(const KernelState &state, const Call &call) {
    if (!state.cell && !state.keyed) return;  // (an op without state: nothing more)
    if (state.keyed) {
      // a key value's cell may close between finding and entering it, when Python drops
      // it from its last few: found again, it is set up again
      for (int attempt = 0;; ++attempt) {
        held_ = state.keyed->find(call);
        try {
          slot_ = held_->enter();
          break;
        } catch (StateFreed &) {
          if (attempt == 3) throw;
        }
      }
      cell_ = held_.get();
    } else {
      cell_ = state.cell.get();  // (the site holds it)
      slot_ = cell_->enter();
    }
    try {
      address_ = cell_->address(slot_);
    } catch (...) {
      cell_->release(slot_);
      throw;
    }
  }
  ~StateUse() {
    if (cell_) cell_->release(slot_);
  }
  StateUse(const StateUse &) = delete;
  StateUse &operator=(const StateUse &) = delete;
  void *address() const { return address_; }

 private:
  StateCell *cell_ = nullptr;
  CellRef held_;  // a key value's cell, which the site's cache may drop meanwhile
  int slot_ = 0;
  void *address_ = nullptr;
};

}  // namespace jaxbind
