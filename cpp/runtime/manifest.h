// jaxbind's C runtime: a bundle's manifest (written by jaxbind/_bundle.py) read. It lists
// every jaxbind call of the program by the call's site digest: its op's label, its C
// kernel (library, symbol, ABI version), its static keyword arguments in the ABI's form,
// jaxbind's batch loop, the buffers the program gives it, and its op's C state. Each call
// becomes a site's core (site_core.h), its libraries opened and its symbols found; a
// failure names the op.
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../call.h"
#include "../kernels.h"
#include "../site_core.h"
#include "../state_cell.h"
#include "c_state.h"
#include "jaxbind/kernel.h"
#include "jaxbind/runtime.h"
#include "json.h"

namespace jaxbind::runtime {

// A failure whose message is complete (it names the op).
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string read_file(const std::string &path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Failure("jaxbind: cannot read " + path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::vector<int64_t> ints(const Json &list, const std::string &what) {
  if (list.kind != Json::kArray) throw Failure(what + " is not a list");
  std::vector<int64_t> out;
  for (const Json &item : list.items) {
    if (item.kind != Json::kInt) throw Failure(what + " holds something other than integers");
    out.push_back(item.integer);
  }
  return out;
}

std::string dtype_name(int64_t code) {
  static const char *names[] = {"invalid",   "bool",     "int8",    "int16",     "int32",
                                "int64",     "uint8",    "uint16",  "uint32",    "uint64",
                                "float16",   "float32",  "float64", "?",         "?",
                                "complex64", "bfloat16", "?",       "complex128"};
  return code >= 0 && code < 19 ? names[code] : "dtype " + std::to_string(code);
}

std::string describe(const std::vector<Buffer> &buffers) {
  std::string out;
  for (const Buffer &b : buffers) {
    if (!out.empty()) out += ", ";
    out += dtype_name(b.dtype) + "[";
    for (int64_t d = 0; d < b.rank; ++d) out += (d ? "," : "") + std::to_string(b.dims[d]);
    out += "]";
  }
  return "(" + out + ")";
}

// Static keyword arguments in the ABI's form, from the manifest's list (jaxbind/_bundle.py
// writes it from _kernels/abi.typed_kwarg), as site.h reads Python's.
void read_kwargs(KernelArgs &out, const Json &list, const std::string &what) {
  if (list.kind != Json::kArray) throw Failure(what + ": the keyword arguments are not a list");
  for (const Json &item : list.items) {
    std::optional<std::string> string;
    std::optional<KernelArgs::Array> array;
    if (item.has("string")) string = item.at("string", Json::kString, what).text;
    if (item.has("array")) {
      const Json &a = item.at("array", Json::kObject, what);
      const std::string &hex = a.at("hex", Json::kString, what).text;
      std::vector<char> bytes(hex.size() / 2);
      for (size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
      array = KernelArgs::Array{a.at("dtype", Json::kInt, what).integer,
                                ints(a.at("shape", Json::kArray, what), what), std::move(bytes)};
    }
    out.add(item.at("name", Json::kString, what).text, item.at("type", Json::kInt, what).integer,
            item.at("int", Json::kInt, what).integer,
            std::strtod(item.at("float", Json::kString, what).text.c_str(), nullptr),
            std::move(string), std::move(array));
  }
}

// A shared library of a bundle, opened once per process and never closed (kernels and
// states may run until the process ends).
void *open_library(const std::string &path, const std::string &label) {
  static std::mutex mu;
  static std::unordered_map<std::string, void *> opened;
  std::lock_guard lock(mu);
  auto it = opened.find(path);
  if (it != opened.end()) return it->second;
  void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char *why = dlerror();
    throw Failure("jaxbind: " + label + ": cannot load its library " + path + " (" +
                  (why ? why : "dlopen failed") +
                  "): the bundle is incomplete; write it again with jaxbind.bundle");
  }
  opened[path] = handle;
  return handle;
}

void *find_symbol(void *library, const std::string &path, const std::string &symbol,
                  const std::string &label) {
  dlerror();
  void *found = dlsym(library, symbol.c_str());
  if (found == nullptr)
    throw Failure("jaxbind: " + label + ": its library " + path + " has no symbol '" + symbol +
                  "': the library is not the one the bundle was written with; write it again");
  return found;
}

// One call site of the bundles registered: its core (what its calls run) and what the
// resolver checks and the refusal says.
struct Entry {
  std::string binding, role;
  CoreRef core;
  std::vector<std::string> buffers;  // each bundle's, as text ("(float32[8]) -> (...)")
};

// What the manifest says of one call: its site's core (its library opened, its symbols
// found, its buffers the one signature it accepts), its C state's description if any.
struct Listed {
  int64_t digest = 0;
  Entry entry;
  std::unique_ptr<CState> state;  // (nullptr: none)
  std::string share;              // the state's setup arguments, which sites share it by
  Signature signature;
  jaxbind_kernel_fn kernel = nullptr;
};

// The state of a call of the manifest, from its "state" entry.
std::unique_ptr<CState> state_of(const Json &s, const std::string &dir, const std::string &label,
                                 const std::string &where) {
  auto state = std::make_unique<CState>();
  state->name = s.at("name", Json::kString, where).text;
  state->label = label;
  auto symbol = [&](const Json &fn) {
    const std::string path = dir + "/" + fn.at("library", Json::kString, where).text;
    return find_symbol(open_library(path, label), path, fn.at("symbol", Json::kString, where).text,
                       label);
  };
  state->setup = reinterpret_cast<jaxbind_setup_fn>(symbol(s.at("setup", Json::kObject, where)));
  if (s.has("teardown"))
    state->teardown =
        reinterpret_cast<jaxbind_teardown_fn>(symbol(s.at("teardown", Json::kObject, where)));
  state->policy = s.at("concurrency", Json::kString, where).text;
  try {
    policy_named(state->policy);
  } catch (std::invalid_argument &e) {
    throw Failure("jaxbind: " + label + ": its state's " + e.what() +
                  ": the bundle was written by another jaxbind; write it again");
  }
  state->pool_size = static_cast<int>(s.at("pool_size", Json::kInt, where).integer);
  read_kwargs(state->arguments, s.at("arguments", Json::kArray, where), where);
  return state;
}

Listed listed(const Json &call, const std::string &dir) {
  Listed out;
  out.digest = std::stoll(call.at("site", Json::kString, "manifest.json: a call").text);
  Entry &entry = out.entry;
  const std::string what = "manifest.json: a call";
  entry.binding = call.at("binding", Json::kString, what).text;
  entry.role = call.at("role", Json::kString, what).text;
  entry.core = CoreRef(new SiteCore());
  SiteCore &core = *entry.core;
  core.label = call.at("label", Json::kString, what).text;
  core.is_kernel = true;
  const std::string where = "manifest.json: the call of " + core.label;
  const Json &kernel = call.at("kernel", Json::kObject, where);
  core.kernel.abi_version = kernel.at("abi_version", Json::kInt, where).integer;
  if (core.kernel.abi_version < 1 || core.kernel.abi_version > JAXBIND_KERNEL_ABI_VERSION)
    throw Failure("jaxbind: " + core.label + ": its kernel implements kernel ABI version " +
                  std::to_string(core.kernel.abi_version) +
                  ", but this runtime calls versions 1 to " +
                  std::to_string(JAXBIND_KERNEL_ABI_VERSION) +
                  ": rebuild the kernel against this jaxbind's jaxbind/kernel.h, or use the "
                  "runtime of the jaxbind that wrote the bundle");
  core.kernel.threads = kernel.at("threads", Json::kInt, where).integer;
  core.whole_batch = kernel.at("batches", Json::kBool, where).boolean;
  const std::string library = dir + "/" + kernel.at("library", Json::kString, where).text;
  out.kernel = reinterpret_cast<jaxbind_kernel_fn>(
      find_symbol(open_library(library, core.label), library,
                  kernel.at("symbol", Json::kString, where).text, core.label));
  read_kwargs(core.kernel.kwargs, call.at("kwargs", Json::kArray, where), where);
  const Json &loop = call.at("loop", Json::kObject, where);
  core.loop.levels = static_cast<int>(loop.at("levels", Json::kInt, where).integer);
  for (int64_t flag : ints(loop.at("batched", Json::kArray, where), where))
    core.loop.batched.push_back(static_cast<uint8_t>(flag != 0));
  if (core.loop.levels < 0 || core.loop.levels > Loop::kMaxLevels)
    throw Failure(where + ": its batch levels are out of range");
  const Json &buffers = call.at("buffers", Json::kObject, where);
  std::vector<std::string> sides;
  for (const char *side : {"inputs", "outputs"}) {
    std::string text;
    for (const Json &b : buffers.at(side, Json::kArray, where).items) {
      int64_t dtype = b.at("dtype", Json::kInt, where).integer;
      std::vector<int64_t> shape = ints(b.at("shape", Json::kArray, where), where);
      out.signature.words.push_back(dtype);
      out.signature.words.push_back(static_cast<int64_t>(shape.size()));
      out.signature.words.insert(out.signature.words.end(), shape.begin(), shape.end());
      text += (text.empty() ? "" : ", ") + dtype_name(dtype) + "[";
      for (size_t d = 0; d < shape.size(); ++d) text += (d ? "," : "") + std::to_string(shape[d]);
      text += "]";
    }
    sides.push_back("(" + text + ")");
  }
  entry.buffers.push_back(sides[0] + " -> " + sides[1]);
  if (call.has("state")) {
    const Json &s = call.at("state", Json::kObject, where);
    out.share = s.at("share", Json::kString, where).text;
    out.state = state_of(s, dir, core.label, where);
  }
  return out;
}

Json manifest_of(const std::string &dir) {
  Json manifest = Json::parse(read_file(dir + "/manifest.json"));
  const Json &format = manifest.at("jaxbind_bundle", Json::kInt, "manifest.json");
  if (format.integer < 1 || format.integer > JAXBIND_RUNTIME_VERSION)
    throw Failure("jaxbind: the bundle " + dir + " is of format " + std::to_string(format.integer) +
                  ", but this runtime reads formats 1 to " +
                  std::to_string(JAXBIND_RUNTIME_VERSION) + "; use a newer jaxbind's runtime");
  const std::string &platform = manifest.at("platform", Json::kString, "manifest.json").text;
  if (platform != "cpu")
    throw Failure("jaxbind: the bundle " + dir + " is for platform '" + platform +
                  "'; this runtime runs CPU bundles");
  return manifest;
}

}  // namespace jaxbind::runtime
