// jaxbind's trampoline: the slots of a "pool" state (concurrency="pool", see state_cell.h),
// which objects are idle and which are taken, by whom. No Python and no messages here: the
// cell turns each outcome into its object or its error.
//
// A slot is empty (no object yet), idle (an object nobody uses) or busy (taken by one call,
// which may be making its object). A call takes an idle slot, else an empty one to make its
// object in, else waits for one to be given back; but a thread that holds one of the slots
// already never waits (a body that calls its own op: the slot it would wait for may be its
// own caller's, given back only when the nested call returns).
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace jaxbind {

class PoolSlots {
 public:
  explicit PoolSlots(size_t size) : slots_(size) {}

  enum Outcome : int {
    kTaken,   // an idle slot, taken
    kMake,    // an empty slot, taken: the caller makes its object (or abandons the slot)
    kClosed,  // the pool was closed: nothing taken
    kMine,    // every slot busy, one of them this thread's: nothing taken
  };
  struct Taken {
    int slot;
    Outcome outcome;
  };

  // A slot for one call, waiting until one is idle or empty (see the top of this file).
  Taken take() {
    const std::thread::id me = std::this_thread::get_id();
    std::unique_lock lock(mu_);
    for (;;) {
      if (closed_) return {-1, kClosed};
      int empty = -1;
      bool mine = false;
      for (size_t k = 0; k < slots_.size(); ++k) {
        Slot &s = slots_[k];
        if (s.status == kIdle) return {hold(s, k, me), kTaken};
        if (s.status == kEmpty && empty < 0) empty = static_cast<int>(k);
        if (s.status == kBusy && s.holder == me) mine = true;
      }
      if (empty >= 0) return {hold(slots_[empty], empty, me), kMake};
      if (mine) return {-1, kMine};
      changed_.wait(lock);
    }
  }

  // A taken slot given back: idle again, for one waiting call.
  void give_back(int slot) {
    {
      std::lock_guard lock(mu_);
      slots_[slot].status = kIdle;
    }
    changed_.notify_one();
  }

  // A taken slot whose object could not be made: empty again.
  void abandon(int slot) {
    {
      std::lock_guard lock(mu_);
      slots_[slot].status = kEmpty;
    }
    changed_.notify_all();
  }

  // Later calls take nothing (kClosed); returns once no slot is taken.
  void close() {
    std::unique_lock lock(mu_);
    closed_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] {
      for (const Slot &s : slots_)
        if (s.status == kBusy) return false;
      return true;
    });
  }

 private:
  enum Status : int { kEmpty, kIdle, kBusy };
  struct Slot {
    Status status = kEmpty;
    std::thread::id holder;  // the thread that took it
  };

  int hold(Slot &s, size_t k, std::thread::id me) {
    s.status = kBusy;
    s.holder = me;
    return static_cast<int>(k);
  }

  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Slot> slots_;  // under mu_
  bool closed_ = false;      // under mu_
};

}  // namespace jaxbind
