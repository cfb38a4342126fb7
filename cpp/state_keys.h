// jaxbind's trampoline: the cells a kernel site finds per call (see state.h). A state
// with key= has a cell per value of the call's key inputs: Python's lease keeps a state
// per key value, the last few of them (jaxbind/_runtime/state.py's Lease); a kernel site
// keeps as many values' bytes here, each with its cell, and asks the lease (the GIL
// taken) only for a value it has not seen (KeyedCells). A CUDA kernel's state has a cell
// per device, set up at the first call on the device (DeviceCells).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "call.h"
#include "held.h"
#include "state.h"
#include "state_python.h"

namespace jaxbind {

namespace nb = nanobind;

// The last kKeys values, the most recently used last; Python's lease (held weakly) is
// asked for a value not among them.
class KeyedCells : public CellFinder {
 public:
  // How many key values a site keeps set up (jaxbind._ext.state_keys_kept: Python's lease
  // keeps as many).
  static constexpr size_t kKeys = 4;

  KeyedCells(std::vector<int> inputs, nb::handle lease, std::string label)
      : inputs_(std::move(inputs)), label_(std::move(label)), lease_(lease) {}

  CellRef find(const Call &call, const Place &) override {
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

  // The lease's cell_for(keys): the cell of the call's key value, set up if new.
  CellRef ask(const Call &call) {
    CellRef cell;
    bool asked = lease_.ask([&](nb::handle lease) {
      nb::list keys;
      for (int i : inputs_) {
        const Buffer &b = call.ins[i];
        nb::list shape;
        for (int64_t d = 0; d < b.rank; ++d) shape.append(b.dims[d]);
        keys.append(nb::make_tuple(reinterpret_cast<uintptr_t>(b.data), nb::tuple(shape),
                                   static_cast<int>(b.dtype)));
      }
      cell = nb::cast<CellHandle &>(lease.attr("cell_for")(nb::tuple(keys))).cell;
    });
    if (!asked) throw LabelledError(label_ + ": its state was freed while a call ran");
    return cell;
  }

  std::vector<int> inputs_;
  std::string label_;
  WeakOwner lease_;  // Python's Lease
  std::mutex mu_;
  std::vector<Entry> entries_;
};

// A CUDA kernel's state (jaxbind.kernel(platform="cuda")): a cell per device, whose
// objects the lease sets up at the device's first call, on the calling thread (with the
// device's context current, as XLA runs the call) and told the call's stream. A device's
// cell is kept for the site's life (the lease frees its states with the site).
class DeviceCells : public CellFinder {
 public:
  DeviceCells(nb::handle lease, std::string label) : label_(std::move(label)), lease_(lease) {}

  CellRef find(const Call &, const Place &place) override {
    {
      std::lock_guard lock(mu_);
      CellRef *kept = kept_for(place.device);
      if (kept != nullptr && !(*kept)->closed()) return *kept;
    }
    CellRef cell;
    bool asked = lease_.ask([&](nb::handle lease) {
      cell = nb::cast<CellHandle &>(lease.attr("cell_for_device")(
                                        place.device, reinterpret_cast<uintptr_t>(place.stream)))
                 .cell;
    });
    if (!asked) throw LabelledError(label_ + ": its state was freed while a call ran");
    std::lock_guard lock(mu_);
    if (CellRef *kept = kept_for(place.device); kept != nullptr)
      *kept = cell;
    else
      cells_.emplace_back(place.device, cell);
    return cell;
  }

 private:
  // The cell kept for `device`, or nullptr (mu_ held).
  CellRef *kept_for(int64_t device) {
    for (auto &[d, cell] : cells_)
      if (d == device) return &cell;
    return nullptr;
  }

  std::string label_;
  WeakOwner lease_;  // Python's Lease
  std::mutex mu_;
  std::vector<std::pair<int64_t, CellRef>> cells_;
};

}  // namespace jaxbind
