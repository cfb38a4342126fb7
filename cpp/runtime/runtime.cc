// jaxbind's C runtime (src/jaxbind/include/jaxbind/runtime.h): the calls of a bundle's
// program run in a PJRT host without Python. Built as its own shared library
// (libjaxbind_runtime.so, in the package's lib/), linked to libc and libstdc++ alone.
//
// It runs the trampoline's own code, without Python: a call finds its site through the
// execute-only door (execute_only.h; the plugin keeps no per-site slot for handlers it
// registers through the PJRT FFI extension, which have an execute stage only), with this
// runtime's resolver, which points it at the SiteCore (site_core.h) that jaxbind_register
// made of the bundle's manifest; the kernel then runs as a trampoline kernel's call whose
// site and signature are known (kernel_path.h: call.h's decoding and batch loop,
// kernels.h's ABI call, on XLA's intra-op threads), the manifest's buffers being the one
// signature the site accepted. An op's C state is a StateCell (state_cell.h: the
// trampoline's policies) whose objects its C setup makes.
//
// Its rooms: manifest.h (a bundle's manifest read into sites), c_state.h (an op's C
// state), json.h, pjrt.h (the few PJRT C API structures it uses), and this file: the
// registry of sites and states, the resolver, the handler, the targets registered with
// a plugin, and the C API.
#include <algorithm>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "../call.h"
#include "../callformat.h"
#include "../errors.h"
#include "../execute_only.h"
#include "../floats.h"
#include "../kernel_path.h"
#include "../site_core.h"
#include "c_state.h"
#include "jaxbind/kernel.h"
#include "jaxbind/runtime.h"
#include "json.h"
#include "manifest.h"
#include "pjrt.h"

#define JAXBIND_EXPORT extern "C" __attribute__((visibility("default")))

namespace jaxbind::runtime {

thread_local std::string last_error;

// Every site and state registered in this process (never freed: a call may be running).
struct Registry {
  std::shared_mutex mu;
  std::unordered_map<int64_t, Entry> sites;
  std::unordered_map<std::string, std::unique_ptr<CState>> states;  // by their setup arguments
  std::set<const void *> apis;  // the plugins jaxbind's targets are registered with

  ~Registry() {  // the library unloaded: its states torn down
    for (auto &state : states) state.second->tear_down();
  }
};

Registry &registry() {
  static Registry r;
  return r;
}

std::string text_attr(const ffi::Dictionary &attrs, const char *name) {
  auto value = attrs.get<std::string_view>(name);
  return value.has_value() ? std::string(*value) : std::string("?");
}

// The execute-only door's resolver here: the instance pointed at the site the manifest
// lists for the call's digest (the registry keeps it; the instance only points at it).
ffi::Error resolve(Instance &instance, const Header &header, const ffi::Dictionary &attrs,
                   const char *) {
  const std::string called =
      "jaxbind: '" + text_attr(attrs, "binding") + "' (role " + text_attr(attrs, "role") + ")";
  Registry &r = registry();
  std::shared_lock lock(r.mu);
  auto it = r.sites.find(header.site);
  if (it == r.sites.end())
    return ffi::Error(ffi::ErrorCode::kNotFound,
                      called + ": the program calls it at site " + std::to_string(header.site) +
                          ", which no registered bundle lists: the bundle's manifest does not "
                          "match its program, or its bundle was not registered "
                          "(jaxbind_register); write the bundle again with jaxbind.bundle");
  const Entry &entry = it->second;
  if (text_attr(attrs, "binding") != entry.binding || text_attr(attrs, "role") != entry.role)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      called + ": the bundle's manifest lists its site for " + entry.core->label +
                          ": the manifest does not match the program");
  instance.cores.push_back(entry.core);
  instance.core.store(entry.core.get(), std::memory_order_release);
  return ffi::Error::Success();
}

// A call the kernel path did not run: its buffers cannot be decoded, or are not the
// manifest's (the one signature its site accepted).
ffi::Error refuse(Instance &instance, const RawAttrs &raw, const ffi::RemainingArgs &args,
                  const ffi::RemainingRets &rets, Frame &frame) {
  SiteCore &core = *instance.core.load(std::memory_order_acquire);  // (never dies here)
  return native_boundary(Where::of_label(core.label), [&] {
    frame.call.decode(args, rets);
    int64_t digest = 0;
    raw.site(digest);
    std::string expected;
    {
      Registry &r = registry();
      std::shared_lock lock(r.mu);
      for (const std::string &text : r.sites.at(digest).buffers)
        expected += (expected.empty() ? "" : " or ") + text;
    }
    throw std::invalid_argument("the call's buffers " + describe(frame.call.ins) + " -> " +
                                describe(frame.call.outs) + " are not the bundle manifest's " +
                                expected +
                                ": the manifest does not match the program; write the bundle "
                                "again");
  });
}

// The FFI handler of every CPU target of jaxbind in a bundle's program.
ffi::Error Execute(ExecutionContext context, ffi::RemainingArgs args, ffi::RemainingRets rets,
                   RawAttrs raw) {
  IeeeFloats ieee;  // subnormals as in jaxbind's trampoline (floats.h)
  ScopedFrame frame;
  Instance *instance = nullptr;
  ffi::Error result = execute_only::find(raw, "cpu", resolve, frame->kept, instance);
  if (result.failure()) return result;
  if (run_kernel_fast(*instance, args, rets, context, *frame, result)) return result;
  return refuse(*instance, raw, args, rets, *frame);
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

// The bundle's calls registered (none if any fails). A site registered already (the same
// op, role, keyword arguments and loop: called at other shapes, in this bundle or another)
// accepts these buffers too, each with its kernel.
void register_bundle(const PJRT_Api *api, const std::string &dir) {
  Json manifest = manifest_of(dir);
  std::vector<Listed> calls;
  for (const Json &call : manifest.at("calls", Json::kArray, "manifest.json").items)
    calls.push_back(listed(call, dir));
  register_targets(api);
  Registry &r = registry();
  std::unique_lock lock(r.mu);
  for (Listed &call : calls) {
    auto known = r.sites.find(call.digest);
    if (known != r.sites.end()) {  // (its op called at other shapes, or in another bundle)
      std::vector<std::string> &buffers = known->second.buffers;
      if (std::find(buffers.begin(), buffers.end(), call.entry.buffers[0]) == buffers.end()) {
        known->second.core->accepted.add(std::move(call.signature), call.kernel);
        buffers.push_back(call.entry.buffers[0]);
      }
      continue;
    }
    SiteCore &core = *call.entry.core;
    core.accepted.add(std::move(call.signature), call.kernel);
    if (call.state != nullptr) {  // sites with equal setup arguments share one state
      auto found = r.states.find(call.share);
      if (found == r.states.end())
        found = r.states.emplace(call.share, std::move(call.state)).first;
      core.kernel.state.finder = std::make_unique<CStateCells>(*found->second);
    }
    r.sites.emplace(call.digest, std::move(call.entry));
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
  for (auto &state : r.states) n += state.second->tear_down();
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
