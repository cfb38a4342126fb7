// jaxbind's trampoline: an op's state (see jaxbind/_runtime/state.py) as kernels reach
// it, without the GIL. A state's objects are Python objects, made and torn down by Python
// (`StateObjects`); C++ holds what a call needs to take one under the state's concurrency
// policy, and the objects' addresses a kernel gets (jaxbind_call::state). Python bodies of
// the op take their objects through the same cells, so a kernel and a Python callable of
// one op keep to one policy.
//
// The rooms, from the bottom up:
//   held.h         Python objects held by C++ (strongly, or weakly and asked with the GIL)
//   state_pool.h   a "pool" state's slots: which are idle, which taken and by whom
//   state_cell.h   StateCell: one state's policy ("lock", "pool", "shared"; their names,
//                  exported as jaxbind._ext.state_policies), its objects' addresses, the
//                  refusal of a call that would wait for its own thread; CellRef
//   state_keys.h   a key= state's cells by the bytes of the call's key inputs (KeyedCells)
//   this file      a kernel site's state (KernelState) and one call's use of it (StateUse)
//
// A kernel site holds its cell counted (CellRef). A state with key= has a cell per key
// value: the site keeps the last few key values' bytes with their cells, and asks Python
// (the GIL taken) only for a value it has not seen.
#pragma once

#include <memory>

#include "call.h"
#include "state_cell.h"
#include "state_keys.h"

namespace jaxbind {

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
