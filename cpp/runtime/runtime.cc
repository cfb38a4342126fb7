// jaxbind's C runtime (src/jaxbind/include/jaxbind/runtime.h): the calls of a bundle's
// program run in a PJRT host without Python. Built as its own shared library
// (libjaxbind_runtime.so, in the package's lib/), linked to libc and libstdc++ alone.
//
// A bundle's manifest (written by jaxbind/_bundle.py) lists every jaxbind call of its
// program by the call's site digest: its op's label, its C kernel (library, symbol, ABI
// version), its static keyword arguments in the ABI's form, jaxbind's batch loop, the
// buffers the program gives it, and its op's C state. jaxbind_register turns each into a
// Site, found at every call by the digest the call's attributes carry (the plugin keeps no
// per-site slot for handlers it registers through the PJRT FFI extension, which have an
// execute stage only). A call decodes its buffers as the trampoline does (call.h), checks
// them against the manifest's, and runs its kernel through the ABI once, or once per batch
// element of jaxbind's loop, on XLA's intra-op threads (workers.h).
#include <dlfcn.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "../call.h"
#include "../callformat.h"
#include "../floats.h"
#include "../workers.h"
#include "jaxbind/kernel.h"
#include "jaxbind/runtime.h"
#include "json.h"
#include "pjrt.h"

#define JAXBIND_EXPORT extern "C" __attribute__((visibility("default")))

namespace jaxbind::runtime {

thread_local std::string last_error;

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

// Static keyword arguments in the ABI's form (jaxbind_kwarg, sorted by name), owned here,
// from the manifest's list (jaxbind/_bundle.py writes it from _kernels/abi.typed_kwarg).
// (cpp/kernels.h's KernelArgs holds the same, read from Python objects.)
class Kwargs {
 public:
  void read(const Json &list, const std::string &what) {
    if (list.kind != Json::kArray) throw Failure(what + ": the keyword arguments are not a list");
    size_t n = list.items.size();
    names_.reserve(n);  // (the ABI's structs point into these: no reallocation)
    strings_.reserve(n);
    data_.reserve(n);
    dims_.reserve(n);
    for (const Json &item : list.items) {
      jaxbind_kwarg kw{};
      names_.push_back(item.at("name", Json::kString, what).text);
      kw.name = names_.back().c_str();
      kw.type = item.at("type", Json::kInt, what).integer;
      kw.int_value = item.at("int", Json::kInt, what).integer;
      kw.float_value = std::strtod(item.at("float", Json::kString, what).text.c_str(), nullptr);
      if (item.has("string")) {
        strings_.push_back(item.at("string", Json::kString, what).text);
        kw.string = strings_.back().c_str();
        kw.string_size = static_cast<int64_t>(strings_.back().size());
      }
      if (item.has("array")) {
        const Json &a = item.at("array", Json::kObject, what);
        dims_.push_back(ints(a.at("shape", Json::kArray, what), what));
        const std::string &hex = a.at("hex", Json::kString, what).text;
        std::vector<char> bytes(hex.size() / 2);
        for (size_t i = 0; i < bytes.size(); ++i)
          bytes[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
        data_.push_back(std::move(bytes));
        kw.array = jaxbind_buffer{data_.back().data(), a.at("dtype", Json::kInt, what).integer,
                                  static_cast<int64_t>(dims_.back().size()), dims_.back().data()};
      }
      kwargs_.push_back(kw);
    }
  }
  int64_t size() const { return static_cast<int64_t>(kwargs_.size()); }
  const jaxbind_kwarg *data() const { return kwargs_.data(); }

 private:
  std::vector<std::string> names_, strings_;
  std::vector<std::vector<char>> data_;
  std::vector<std::vector<int64_t>> dims_;
  std::vector<jaxbind_kwarg> kwargs_;
};

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

// An op's C state (jaxbind.c_state): its objects, set up at the first call of a site that
// uses it, under its concurrency policy ("lock": one object, one call at a time; "pool":
// up to pool_size objects, each used by one call at a time; "shared": one object, every
// call at once). (cpp/state.h's StateCell keeps the same policies for objects Python made.)
struct CState {
  enum Policy { kLock, kPool, kShared };
  std::string name, label;  // the setup's name; the first site's op, for messages
  jaxbind_setup_fn setup = nullptr;
  jaxbind_teardown_fn teardown = nullptr;
  Policy policy = kLock;
  size_t pool_size = 1;
  Kwargs arguments;

  std::mutex mu, use;  // mu: the objects; use: the one object of "lock"
  std::condition_variable returned;
  std::vector<void *> objects, idle;

  // A new object (mu held).
  void *make() {
    char message[1024];
    message[0] = '\0';
    jaxbind_setup args{JAXBIND_KERNEL_ABI_VERSION, arguments.size(), arguments.data(), message,
                       sizeof(message)};
    void *object = nullptr;
    IeeeFloats ieee;
    int32_t status = setup(&args, &object);
    message[sizeof(message) - 1] = '\0';
    if (status != 0)
      throw Failure("jaxbind: " + label + ": its state's setup '" + name + "' failed: " +
                    (message[0] ? std::string(message)
                                : "it returned status " + std::to_string(status) +
                                      " without writing a message"));
    if (object == nullptr)
      throw Failure("jaxbind: " + label + ": its state's setup '" + name +
                    "' returned success but no object (NULL)");
    objects.push_back(object);
    return object;
  }

  void *acquire() {
    if (policy == kLock) use.lock();
    std::unique_lock lock(mu);
    try {
      if (policy != kPool) return objects.empty() ? make() : objects[0];
      for (;;) {
        if (!idle.empty()) {
          void *object = idle.back();
          idle.pop_back();
          return object;
        }
        if (objects.size() < pool_size) return make();
        returned.wait(lock);
      }
    } catch (...) {
      if (policy == kLock) use.unlock();
      throw;
    }
  }

  void release(void *object) {
    if (policy == kLock) return use.unlock();
    if (policy != kPool) return;
    {
      std::lock_guard lock(mu);
      idle.push_back(object);
    }
    returned.notify_one();
  }

  int64_t tear_down() {
    std::lock_guard lock(mu);
    int64_t n = static_cast<int64_t>(objects.size());
    if (teardown != nullptr)
      for (void *object : objects) teardown(object);
    objects.clear();
    idle.clear();
    return n;
  }
};

class StateUse {
 public:
  explicit StateUse(CState *state) : state_(state) {
    if (state_ != nullptr) object_ = state_->acquire();
  }
  ~StateUse() {
    if (state_ != nullptr) state_->release(object_);
  }
  StateUse(const StateUse &) = delete;
  StateUse &operator=(const StateUse &) = delete;
  void *object() const { return object_; }

 private:
  CState *state_;
  void *object_ = nullptr;
};

// One call site of a bundle's program: what its calls run.
struct Site {
  std::string binding, role, label;
  jaxbind_kernel_fn kernel = nullptr;
  int64_t abi_version = JAXBIND_KERNEL_ABI_VERSION;
  int64_t threads = 0;  // at most this many of XLA's threads (0: all)
  bool batches = false;
  Loop loop;
  Kwargs kwargs;
  Signature expected;  // the buffers the program gives it
  std::string expected_text;
  CState *state = nullptr;
  std::atomic<bool> named{false};  // the call's binding and role checked once
};

// Every site and state registered in this process (never freed: a call may be running).
struct Registry {
  std::shared_mutex mu;
  std::unordered_map<int64_t, Site *> sites;
  std::unordered_map<std::string, CState *> states;
  std::vector<std::unique_ptr<Site>> all_sites;
  std::vector<std::unique_ptr<CState>> all_states;
  std::set<const void *> apis;  // the plugins jaxbind's targets are registered with

  ~Registry() {  // the library unloaded: its states torn down
    for (auto &state : all_states) state->tear_down();
  }
};

Registry &registry() {
  static Registry r;
  return r;
}

// The ABI call of one kernel on one (batch element of a) call. (cpp/kernels.h's
// call_kernel does the same for kernels Python registered.)
void call_kernel(const Site &site, const Call &call, const Loop *loop, const Workers &workers) {
  StateUse state(site.state);
  char message[1024];
  message[0] = '\0';
  jaxbind_call abi{};
  abi.abi_version = site.abi_version;
  abi.n_inputs = static_cast<int64_t>(call.ins.size());
  abi.inputs = call.ins.data();
  abi.n_outputs = static_cast<int64_t>(call.outs.size());
  abi.outputs = call.outs.data();
  abi.n_kwargs = site.kwargs.size();
  abi.kwargs = site.kwargs.data();
  abi.batch_levels = loop != nullptr ? loop->levels : 0;
  abi.batched = loop != nullptr ? loop->batched.data() : nullptr;
  abi.error = message;
  abi.error_size = sizeof(message);
  abi.n_threads = workers.threads();
  abi.parallel_for = parallel_for;
  abi.workers = const_cast<Workers *>(&workers);
  abi.state = state.object();
  int32_t status = site.kernel(&abi);
  if (status == 0) return;
  message[sizeof(message) - 1] = '\0';
  throw Failure("jaxbind: kernel of " + site.label + " failed: " +
                (message[0] ? std::string(message)
                            : "the kernel returned status " + std::to_string(status) +
                                  " without writing a message into call->error"));
}

std::string text_attr(const ffi::Dictionary &attrs, const char *name) {
  auto value = attrs.get<std::string_view>(name);
  return value.has_value() ? std::string(*value) : std::string("?");
}

ffi::Error unlisted(const RawAttrs &raw, int64_t digest) {
  ffi::Dictionary attrs = raw.dict();
  return ffi::Error(ffi::ErrorCode::kNotFound,
                    "jaxbind: '" + text_attr(attrs, "binding") + "' (role " +
                        text_attr(attrs, "role") + "): the program calls it at site " +
                        std::to_string(digest) +
                        ", which no registered bundle lists: the bundle's manifest does not "
                        "match its program, or its bundle was not registered "
                        "(jaxbind_register); write the bundle again with jaxbind.bundle");
}

// The FFI handler of every CPU target of jaxbind in a bundle's program.
ffi::Error Execute(ExecutionContext context, ffi::RemainingArgs args, ffi::RemainingRets rets,
                   RawAttrs raw) {
  IeeeFloats ieee;  // subnormals as in jaxbind's trampoline (floats.h)
  int64_t digest = 0;
  if (!raw.site(digest))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "jaxbind: custom call has no 'site' attribute; it was not made by jaxbind");
  Site *site = nullptr;
  {
    Registry &r = registry();
    std::shared_lock lock(r.mu);
    auto it = r.sites.find(digest);
    if (it != r.sites.end()) site = it->second;
  }
  if (site == nullptr) return unlisted(raw, digest);
  thread_local Call call, element;
  try {
    if (!site->named.load(std::memory_order_acquire)) {
      ffi::Dictionary attrs = raw.dict();
      if (text_attr(attrs, "binding") != site->binding || text_attr(attrs, "role") != site->role)
        throw Failure("jaxbind: '" + text_attr(attrs, "binding") + "' (role " +
                      text_attr(attrs, "role") + "): the bundle's manifest lists its site for " +
                      site->label + ": the manifest does not match the program");
      site->named.store(true, std::memory_order_release);
    }
    call.decode(args, rets);
    if (!site->expected.matches(call))
      throw Failure("jaxbind: " + site->label + ": the call's buffers " + describe(call.ins) +
                    " -> " + describe(call.outs) + " are not the bundle manifest's " +
                    site->expected_text +
                    ": the manifest does not match the program; write the bundle again");
    Workers workers(context, site->threads);
    const Loop *batch = site->batches ? &site->loop : nullptr;
    site->loop.run(call, site->batches, element, workers,
                   [&](const Call &c, const Workers &w) { call_kernel(*site, c, batch, w); });
  } catch (Failure &e) {
    return ffi::Error(ffi::ErrorCode::kInternal, e.what());
  } catch (std::exception &e) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "jaxbind: " + site->label + ": " + std::string(e.what()));
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(kExecute, Execute,
                       ffi::Ffi::Bind()
                           .Ctx<ExecutionContext>()  // XLA's intra-op pool
                           .RemainingArgs()          // inputs, any dtype and rank
                           .RemainingRets()          // outputs, written in place
                           .Attrs<RawAttrs>());      // the call format's attributes

// The CPU targets jaxbind's lowering names (jaxbind/_rules/targets.py: the CPU rows).
constexpr const char *kTargets[] = {"jaxbind_cpu", "jaxbind_cpu_effect", "jaxbind_partitioned"};

std::string pjrt_message(const pjrt::ApiHead *api, pjrt::Error *error) {
  pjrt::ErrorMessageArgs message{sizeof(pjrt::ErrorMessageArgs), nullptr, error, nullptr, 0};
  api->error_message(&message);
  std::string text(message.message, message.message_size);
  pjrt::ErrorDestroyArgs destroy{sizeof(pjrt::ErrorDestroyArgs), nullptr, error};
  api->error_destroy(&destroy);
  return text;
}

// jaxbind's targets registered with a plugin (once per plugin), through its FFI extension.
void register_targets(const PJRT_Api *opaque) {
  auto *api = reinterpret_cast<const pjrt::ApiHead *>(opaque);
  if (api == nullptr) throw Failure("jaxbind_register: the PJRT_Api is NULL");
  Registry &r = registry();
  {
    std::shared_lock lock(r.mu);
    if (r.apis.count(api)) return;
  }
  const pjrt::FfiExtension *ffi_extension = nullptr;
  for (const pjrt::ExtensionBase *e = api->extension_start; e != nullptr; e = e->next)
    if (e->type == pjrt::kExtensionFfi)
      ffi_extension = reinterpret_cast<const pjrt::FfiExtension *>(e);
  if (ffi_extension == nullptr || ffi_extension->base.struct_size < sizeof(pjrt::FfiExtension) ||
      ffi_extension->register_handler == nullptr)
    throw Failure("jaxbind_register: the PJRT plugin (C API " +
                  std::to_string(api->pjrt_api_version.major_version) + "." +
                  std::to_string(api->pjrt_api_version.minor_version) +
                  ") has no FFI extension that registers handlers; jaxbind needs one (XLA's "
                  "CPU plugin has it since PJRT C API 0.6x)");
  for (const char *target : kTargets) {
    static const char platform[] = "Host";
    pjrt::RegisterHandlerArgs args{sizeof(pjrt::RegisterHandlerArgs),
                                   target,
                                   std::char_traits<char>::length(target),
                                   reinterpret_cast<void *>(kExecute),
                                   platform,
                                   sizeof(platform) - 1,
                                   0};
    if (pjrt::Error *error = ffi_extension->register_handler(&args))
      throw Failure(std::string("jaxbind_register: the plugin refused jaxbind's target ") + target +
                    ": " + pjrt_message(api, error));
  }
  std::unique_lock lock(r.mu);
  r.apis.insert(api);
}

// A call of the manifest as a Site (its library opened, its symbols found), and its state.
std::unique_ptr<Site> site_of(const Json &entry, const std::string &dir,
                              std::unique_ptr<CState> &state_out, std::string &state_key) {
  auto site = std::make_unique<Site>();
  const std::string what = "manifest.json: a call";
  site->binding = entry.at("binding", Json::kString, what).text;
  site->role = entry.at("role", Json::kString, what).text;
  site->label = entry.at("label", Json::kString, what).text;
  const std::string where = "manifest.json: the call of " + site->label;
  const Json &kernel = entry.at("kernel", Json::kObject, where);
  site->abi_version = kernel.at("abi_version", Json::kInt, where).integer;
  if (site->abi_version < 1 || site->abi_version > JAXBIND_KERNEL_ABI_VERSION)
    throw Failure("jaxbind: " + site->label + ": its kernel implements kernel ABI version " +
                  std::to_string(site->abi_version) + ", but this runtime calls versions 1 to " +
                  std::to_string(JAXBIND_KERNEL_ABI_VERSION) +
                  ": rebuild the kernel against this jaxbind's jaxbind/kernel.h, or use the "
                  "runtime of the jaxbind that wrote the bundle");
  site->threads = kernel.at("threads", Json::kInt, where).integer;
  site->batches = kernel.at("batches", Json::kBool, where).boolean;
  const std::string library = dir + "/" + kernel.at("library", Json::kString, where).text;
  void *handle = open_library(library, site->label);
  site->kernel = reinterpret_cast<jaxbind_kernel_fn>(
      find_symbol(handle, library, kernel.at("symbol", Json::kString, where).text, site->label));
  site->kwargs.read(entry.at("kwargs", Json::kArray, where), where);
  const Json &loop = entry.at("loop", Json::kObject, where);
  site->loop.levels = static_cast<int>(loop.at("levels", Json::kInt, where).integer);
  for (int64_t flag : ints(loop.at("batched", Json::kArray, where), where))
    site->loop.batched.push_back(static_cast<uint8_t>(flag != 0));
  if (site->loop.levels < 0 || site->loop.levels > Loop::kMaxLevels)
    throw Failure(where + ": its batch levels are out of range");
  const Json &buffers = entry.at("buffers", Json::kObject, where);
  std::vector<std::string> sides;
  for (const char *side : {"inputs", "outputs"}) {
    std::string text;
    for (const Json &b : buffers.at(side, Json::kArray, where).items) {
      int64_t dtype = b.at("dtype", Json::kInt, where).integer;
      std::vector<int64_t> shape = ints(b.at("shape", Json::kArray, where), where);
      site->expected.words.push_back(dtype);
      site->expected.words.push_back(static_cast<int64_t>(shape.size()));
      site->expected.words.insert(site->expected.words.end(), shape.begin(), shape.end());
      text += (text.empty() ? "" : ", ") + dtype_name(dtype) + "[";
      for (size_t d = 0; d < shape.size(); ++d) text += (d ? "," : "") + std::to_string(shape[d]);
      text += "]";
    }
    sides.push_back("(" + text + ")");
  }
  site->expected_text = sides[0] + " -> " + sides[1];
  if (entry.has("state")) {
    const Json &s = entry.at("state", Json::kObject, where);
    state_key = s.at("share", Json::kString, where).text;
    auto state = std::make_unique<CState>();
    state->name = s.at("name", Json::kString, where).text;
    state->label = site->label;
    const Json &setup = s.at("setup", Json::kObject, where);
    const std::string setup_library = dir + "/" + setup.at("library", Json::kString, where).text;
    state->setup = reinterpret_cast<jaxbind_setup_fn>(
        find_symbol(open_library(setup_library, site->label), setup_library,
                    setup.at("symbol", Json::kString, where).text, site->label));
    if (s.has("teardown")) {
      const Json &teardown = s.at("teardown", Json::kObject, where);
      const std::string path = dir + "/" + teardown.at("library", Json::kString, where).text;
      state->teardown = reinterpret_cast<jaxbind_teardown_fn>(
          find_symbol(open_library(path, site->label), path,
                      teardown.at("symbol", Json::kString, where).text, site->label));
    }
    const std::string &policy = s.at("concurrency", Json::kString, where).text;
    state->policy = policy == "pool"     ? CState::kPool
                    : policy == "shared" ? CState::kShared
                                         : CState::kLock;
    state->pool_size = static_cast<size_t>(s.at("pool_size", Json::kInt, where).integer);
    if (state->pool_size < 1) state->pool_size = 1;
    state->arguments.read(s.at("arguments", Json::kArray, where), where);
    state_out = std::move(state);
  }
  return site;
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

void register_bundle(const PJRT_Api *api, const std::string &dir) {
  Json manifest = manifest_of(dir);
  std::vector<std::unique_ptr<Site>> sites;
  std::vector<std::pair<std::string, std::unique_ptr<CState>>> states;
  std::vector<int64_t> digests;
  for (const Json &entry : manifest.at("calls", Json::kArray, "manifest.json").items) {
    const std::string &digest = entry.at("site", Json::kString, "manifest.json: a call").text;
    std::unique_ptr<CState> state;
    std::string key;
    sites.push_back(site_of(entry, dir, state, key));
    digests.push_back(std::stoll(digest));
    states.emplace_back(key, std::move(state));
  }
  register_targets(api);
  Registry &r = registry();
  std::unique_lock lock(r.mu);
  for (size_t i = 0; i < sites.size(); ++i) {
    auto &[key, state] = states[i];
    if (state != nullptr) {  // sites with equal setup arguments share one state
      auto found = r.states.find(key);
      if (found == r.states.end()) {
        found = r.states.emplace(key, state.get()).first;
        r.all_states.push_back(std::move(state));
      }
      sites[i]->state = found->second;
    }
    r.sites[digests[i]] = sites[i].get();
    r.all_sites.push_back(std::move(sites[i]));
  }
}

}  // namespace jaxbind::runtime

using namespace jaxbind::runtime;  // NOLINT: the C API's definitions

struct jaxbind_bundle {
  std::string program, options;
  struct Io {
    int32_t pjrt_type;
    std::vector<int64_t> dims;
    size_t bytes;
  };
  std::vector<Io> inputs, outputs;
};

JAXBIND_EXPORT int32_t jaxbind_register(const struct PJRT_Api *api, const char *bundle_dir) {
  try {
    register_bundle(api, bundle_dir != nullptr ? bundle_dir : ".");
    last_error.clear();
    return 0;
  } catch (std::exception &e) {
    last_error = e.what();
    return 1;
  }
}

JAXBIND_EXPORT int64_t jaxbind_release(void) {
  Registry &r = registry();
  std::unique_lock lock(r.mu);
  int64_t n = 0;
  for (auto &state : r.all_states) n += state->tear_down();
  return n;
}

JAXBIND_EXPORT const char *jaxbind_error(void) { return last_error.c_str(); }

JAXBIND_EXPORT jaxbind_bundle *jaxbind_bundle_open(const char *bundle_dir) {
  try {
    std::string dir = bundle_dir != nullptr ? bundle_dir : ".";
    Json manifest = manifest_of(dir);
    auto bundle = std::make_unique<jaxbind_bundle>();
    bundle->program = read_file(dir + "/" + manifest.at("program", Json::kString, "manifest").text);
    bundle->options =
        read_file(dir + "/" + manifest.at("compile_options", Json::kString, "manifest").text);
    for (auto [side, out] : {std::pair{"inputs", &bundle->inputs}, {"outputs", &bundle->outputs}})
      for (const Json &io : manifest.at(side, Json::kArray, "manifest.json").items) {
        const std::string what = std::string("manifest.json: the program's ") + side;
        out->push_back({static_cast<int32_t>(io.at("pjrt_type", Json::kInt, what).integer),
                        ints(io.at("shape", Json::kArray, what), what),
                        static_cast<size_t>(io.at("bytes", Json::kInt, what).integer)});
      }
    last_error.clear();
    return bundle.release();
  } catch (std::exception &e) {
    last_error = e.what();
    return nullptr;
  }
}

JAXBIND_EXPORT void jaxbind_bundle_close(jaxbind_bundle *bundle) { delete bundle; }

JAXBIND_EXPORT const char *jaxbind_bundle_program(const jaxbind_bundle *bundle, size_t *size) {
  *size = bundle->program.size();
  return bundle->program.data();
}

JAXBIND_EXPORT const char *jaxbind_bundle_compile_options(const jaxbind_bundle *bundle,
                                                          size_t *size) {
  *size = bundle->options.size();
  return bundle->options.data();
}

JAXBIND_EXPORT int64_t jaxbind_bundle_n_inputs(const jaxbind_bundle *bundle) {
  return static_cast<int64_t>(bundle->inputs.size());
}

JAXBIND_EXPORT int64_t jaxbind_bundle_n_outputs(const jaxbind_bundle *bundle) {
  return static_cast<int64_t>(bundle->outputs.size());
}

static int32_t io_of(const std::vector<jaxbind_bundle::Io> &side, int64_t i, int32_t *pjrt_type,
                     int64_t *rank, const int64_t **dims, size_t *bytes) {
  if (i < 0 || i >= static_cast<int64_t>(side.size())) return 1;
  const jaxbind_bundle::Io &io = side[static_cast<size_t>(i)];
  *pjrt_type = io.pjrt_type;
  *rank = static_cast<int64_t>(io.dims.size());
  *dims = io.dims.data();
  *bytes = io.bytes;
  return 0;
}

JAXBIND_EXPORT int32_t jaxbind_bundle_input(const jaxbind_bundle *bundle, int64_t i,
                                            int32_t *pjrt_type, int64_t *rank, const int64_t **dims,
                                            size_t *bytes) {
  return io_of(bundle->inputs, i, pjrt_type, rank, dims, bytes);
}

JAXBIND_EXPORT int32_t jaxbind_bundle_output(const jaxbind_bundle *bundle, int64_t i,
                                             int32_t *pjrt_type, int64_t *rank,
                                             const int64_t **dims, size_t *bytes) {
  return io_of(bundle->outputs, i, pjrt_type, rank, dims, bytes);
}
