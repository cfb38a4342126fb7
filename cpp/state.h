// jaxbind's trampoline and C runtime: an op's state as kernels reach it, without the GIL
// and without Python. In the trampoline a state's objects are Python objects, made and
// torn down by Python (jaxbind/_runtime/state.py, `StateObjects`); in the C runtime, a C
// state's objects, made by its C setup (cpp/runtime/). C++ holds what a call needs to
// take one under the state's concurrency policy, and the objects' addresses a kernel gets
// (jaxbind_call::state). Python bodies of the op take their objects through the same
// cells, so a kernel and a Python callable of one op keep to one policy.
//
// The rooms, from the bottom up:
//   state_pool.h   a "pool" state's slots: which are idle, which taken and by whom
//   state_cell.h   StateCell: one state's policy ("lock", "pool", "shared"; their names,
//                  exported as jaxbind._ext.state_policies), its objects' addresses (from
//                  its Provider), the refusal of a call that would wait for its own
//                  thread; CellRef
//   this file      a kernel site's state (KernelState) and one call's use of it (StateUse)
// and, Python's (the trampoline's alone):
//   held.h         Python objects held by C++ (strongly, or weakly and asked with the GIL)
//   state_python.h a cell whose objects Python's state provides; its handle in Python
//   state_keys.h   a key= state's cells by the bytes of the call's key inputs (KeyedCells);
//                  a CUDA kernel's, by device (DeviceCells)
//
// A kernel site holds its cell counted (CellRef), or finds one per call (a CellFinder):
// a state with key= has a cell per key value (the site keeps the last few key values'
// bytes with their cells, and asks Python, the GIL taken, only for a value it has not
// seen); the C runtime's C state has its current cell, set up again after a release.
#pragma once

#include <memory>

#include "call.h"
#include "state_cell.h"

namespace jaxbind {

// A kernel site's cells found per call: by key value (state_keys.h), by device (a CUDA
// kernel's, state_keys.h), or the C runtime's.
struct CellFinder {
  virtual ~CellFinder() = default;
  // The cell of the call at `place` (it may close before it is entered: then found again).
  virtual CellRef find(const Call &call, const Place &place) = 0;
};

// A kernel site's state: a cell, or the cells a finder gives; none for an op without.
struct KernelState {
  CellRef cell;
  std::unique_ptr<CellFinder> finder;
  bool serial_tasks = false;  // its ranges share the call's object: run them in order

  explicit operator bool() const { return cell || finder; }
};

// One kernel call's use of its site's state: the object taken under the policy for the
// call (and given back after), and its address.
class StateUse {
 public:
  StateUse(const KernelState &state, const Call &call, const Place &place) {
    if (!state.cell && !state.finder) return;  // (an op without state: nothing more)
    if (state.finder) {
      // a found cell may close between finding and entering it (when Python drops a key
      // value from its last few, or the C runtime releases its states): found again, it
      // is set up again
      for (int attempt = 0;; ++attempt) {
        held_ = state.finder->find(call, place);
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
  CellRef held_;  // a found cell, which its finder may drop meanwhile
  int slot_ = 0;
  void *address_ = nullptr;
};

}  // namespace jaxbind
