// jaxbind's C runtime: an op's C state (jaxbind.c_state) in a PJRT host. Its calls take
// its objects through a StateCell (state_cell.h), under the trampoline's concurrency
// policies; the objects are made by the state's C setup, each when its slot is first
// asked for, and torn down by its C teardown (jaxbind_release, or the runtime unloaded).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../call.h"
#include "../kernels.h"
#include "../state.h"
#include "../state_cell.h"
#include "jaxbind/kernel.h"

namespace jaxbind::runtime {

// An op's C state (jaxbind.c_state): its setup, teardown and setup arguments, and its
// current cell (state_cell.h, under the trampoline's policies), made at the first call
// that needs it; jaxbind_release closes it, and the next call makes a new one.
class CState {
 public:
  std::string name, label;  // the setup's name; the first site's op, for messages
  std::string policy;       // its concurrency (kPolicies)
  int pool_size = 1;
  jaxbind_setup_fn setup = nullptr;
  jaxbind_teardown_fn teardown = nullptr;
  KernelArgs arguments;

  // The current cell (made if there is none).
  CellRef current() {
    std::lock_guard lock(mu_);
    if (!cell_)
      cell_ =
          CellRef(new StateCell(policy, pool_size, std::make_unique<Objects>(*this), label, name));
    return cell_;
  }

  // The current cell closed (waiting for the calls that use an object) and its objects
  // torn down: how many.
  int64_t tear_down() {
    CellRef old;
    {
      std::lock_guard lock(mu_);
      old = std::move(cell_);
    }
    if (!old) return 0;
    std::unique_ptr<StateCell::Provider> objects = old->close<NothingHeld>();
    return static_cast<Objects &>(*objects).tear_down();
  }

 private:
  // A cell's objects, each made by the C setup when the cell first asks for its slot.
  class Objects : public StateCell::Provider {
   public:
    explicit Objects(const CState &state) : state_(state) {}
    ~Objects() override { tear_down(); }
    bool provide(int slot, bool, void *&address) override {
      std::lock_guard lock(mu_);
      if (objects_.size() <= static_cast<size_t>(slot)) objects_.resize(slot + 1, nullptr);
      if (objects_[slot] == nullptr) objects_[slot] = state_.make();
      address = objects_[slot];
      return true;
    }
    int64_t tear_down() {
      std::lock_guard lock(mu_);
      int64_t n = 0;
      for (void *object : objects_)
        if (object != nullptr) {
          if (state_.teardown != nullptr) state_.teardown(object);
          ++n;
        }
      objects_.clear();
      return n;
    }

   private:
    const CState &state_;
    std::mutex mu_;
    std::vector<void *> objects_;  // by slot (nullptr: not made)
  };

  // A new object, from the setup. Throws LabelledError naming the op.
  void *make() const {
    char message[1024];
    message[0] = '\0';
    jaxbind_setup args{JAXBIND_KERNEL_ABI_VERSION,
                       arguments.size(),
                       arguments.data(),
                       message,
                       sizeof(message),
                       JAXBIND_PLATFORM_CPU,  // (the C runtime runs CPU programs)
                       nullptr,
                       -1};
    void *object = nullptr;
    int32_t status = setup(&args, &object);
    message[sizeof(message) - 1] = '\0';
    if (status != 0)
      throw LabelledError(label + ": its state's setup '" + name + "' failed: " +
                          (message[0] ? std::string(message)
                                      : "it returned status " + std::to_string(status) +
                                            " without writing a message"));
    if (object == nullptr)
      throw LabelledError(label + ": its state's setup '" + name +
                          "' returned success but no object (NULL)");
    return object;
  }

  std::mutex mu_;
  CellRef cell_;
};

// A site's way to its op's C state: the state's current cell (StateUse, state.h).
struct CStateCells : CellFinder {
  explicit CStateCells(CState &state) : state(state) {}
  CellRef find(const Call &, const Place &) override { return state.current(); }
  CState &state;
};

}  // namespace jaxbind::runtime
