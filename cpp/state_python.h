// jaxbind's trampoline: a state's cell (state_cell.h) as Python reaches it. Its objects
// are Python's (jaxbind/_runtime/state.py, StateObjects, held weakly): the cell's provider
// asks the state's provide(slot, make), the GIL taken; Python bodies take their objects
// through the same cell, the GIL released while they wait.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <nanobind/nanobind.h>

#include "held.h"
#include "state_cell.h"

namespace jaxbind {

namespace nb = nanobind;

// A cell's objects, made by the Python state (held weakly): provide(slot, make) makes the
// object of a slot (make) and gives its address.
class PythonObjects : public StateCell::Provider {
 public:
  explicit PythonObjects(nb::handle owner) : owner_(owner) {}
  bool provide(int slot, bool make, void *&address) override {
    return owner_.ask([&](nb::handle owner) {
      address = reinterpret_cast<void *>(nb::cast<uintptr_t>(owner.attr("provide")(slot, make)));
    });
  }

 private:
  WeakOwner owner_;
};

// What Python holds of a cell (jaxbind._ext.StateCell).
struct CellHandle {
  CellRef cell;

  CellHandle(const std::string &policy, int size, nb::handle owner, std::string label,
             std::string state)
      : cell(new StateCell(policy, size, std::make_unique<PythonObjects>(owner), std::move(label),
                           std::move(state))) {}

  // (slot, new): an object for a Python body (see StateCell::acquire), waiting without
  // the GIL; the cell's errors with "jaxbind: " before them (a ReentrantUse stays one).
  std::pair<int, bool> acquire() {
    try {
      return cell->acquire<nb::gil_scoped_release>();
    } catch (ReentrantUse &e) {  // (its own Python type: see jaxbind_ext.cc)
      throw ReentrantUse(std::string("jaxbind: ") + e.what());
    } catch (LabelledError &e) {
      throw std::runtime_error(std::string("jaxbind: ") + e.what());
    }
  }

  // No object is used after this returns (waiting without the GIL); the weak reference to
  // the state let go. Then the state may tear its objects down.
  void close() { cell->close<nb::gil_scoped_release>(); }
};

}  // namespace jaxbind
