// Warren native addon: the N-API face of the helper (node-addon-api, C++17).
//
// This layer only converts and validates JS values, calls the C core (wn.h)
// and turns `wn_error`s into the TypeScript WarrenError class, which
// src/native/index.ts hands over through init(). Everything with a syscall in
// it lives in the C files, shared with the static helper binaries.
#include <napi.h>
#include <v8.h>
#include <uv.h>

#include <malloc.h>
#include <poll.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "wn.h"
#include "confine.h"
#include "isolate.h"
#include "bpf_egress.h"

namespace {

constexpr const char* kVersion = "0.1.0";

struct Watcher;
struct ZWatcher;

// Per-environment state (worker threads each get their own); freed with the env.
struct AddonState {
  Napi::FunctionReference error_ctor;
  std::set<Watcher*> watchers;
  std::set<ZWatcher*> zwatchers;
  bool closing = false;
};

AddonState* State(Napi::Env env) { return env.GetInstanceData<AddonState>(); }

// ---- errors ---------------------------------------------------------------

Napi::Value ErrorValue(Napi::Env env, const char* code, const std::string& message, int errnum) {
  AddonState* st = State(env);
  if (st == nullptr || st->error_ctor.IsEmpty()) {
    Napi::Error err = Napi::Error::New(env, std::string(code) + ": " + message);
    err.Set("code", Napi::String::New(env, code));
    if (errnum) err.Set("errno", Napi::Number::New(env, errnum));
    return err.Value();
  }
  std::vector<napi_value> args = {
      Napi::String::New(env, code),
      Napi::String::New(env, message),
      env.Undefined(),
      errnum ? Napi::Number::New(env, errnum) : env.Undefined(),
  };
  return st->error_ctor.New(args);
}

[[noreturn]] void ThrowCode(Napi::Env env, const char* code, const std::string& message, int errnum) {
  throw Napi::Error(env, ErrorValue(env, code, message, errnum));
}

[[noreturn]] void Throw(Napi::Env env, const wn_error& e) {
  ThrowCode(env, wn_code_name(e.code), e.msg, e.errnum);
}

[[noreturn]] void Invalid(Napi::Env env, const std::string& message) {
  ThrowCode(env, "INVALID_ARGUMENT", message, 0);
}

// A system call the addon makes itself failed: NATIVE_ERROR with errno, which must still be the
// call's (nothing may run in between).
#define THROW_ERRNO(env, ...)                                \
  do {                                                       \
    wn_error errno_err_;                                     \
    wn_fail_errno(&errno_err_, WN_NATIVE_ERROR, __VA_ARGS__); \
    Throw((env), errno_err_);                                \
  } while (0)

// ---- argument conversion ----------------------------------------------------

std::string ToStr(Napi::Env env, Napi::Value v, const std::string& what, size_t max_len = WN_MAX_PATH) {
  if (!v.IsString()) Invalid(env, what + " must be a string");
  std::string s = v.As<Napi::String>().Utf8Value();
  if (s.find('\0') != std::string::npos) Invalid(env, what + " must not contain NUL");
  if (s.size() > max_len) Invalid(env, what + " is longer than " + std::to_string(max_len) + " bytes");
  return s;
}

int64_t ToInt(Napi::Env env, Napi::Value v, const std::string& what, int64_t min, int64_t max) {
  if (!v.IsNumber()) Invalid(env, what + " must be a number");
  double d = v.As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d) || std::floor(d) != d) Invalid(env, what + " must be an integer");
  if (d < static_cast<double>(min) || d > static_cast<double>(max))
    Invalid(env, what + " must be in " + std::to_string(min) + ".." + std::to_string(max));
  return static_cast<int64_t>(d);
}

bool ToBool(Napi::Env env, Napi::Value v, const std::string& what) {
  if (!v.IsBoolean()) Invalid(env, what + " must be a boolean");
  return v.As<Napi::Boolean>().Value();
}

Napi::Object ToObj(Napi::Env env, Napi::Value v, const std::string& what) {
  if (!v.IsObject() || v.IsArray() || v.IsFunction()) Invalid(env, what + " must be an object");
  return v.As<Napi::Object>();
}

bool Has(Napi::Object o, const char* key) {
  Napi::Value v = o.Get(key);
  return !v.IsUndefined() && !v.IsNull();
}

std::vector<std::string> ToStrArray(Napi::Env env, Napi::Value v, const std::string& what, size_t max_items,
                                    size_t max_len) {
  if (!v.IsArray()) Invalid(env, what + " must be an array of strings");
  Napi::Array a = v.As<Napi::Array>();
  uint32_t n = a.Length();
  if (n > max_items) Invalid(env, what + " has more than " + std::to_string(max_items) + " entries");
  std::vector<std::string> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; i++) out.push_back(ToStr(env, a.Get(i), what + "[" + std::to_string(i) + "]", max_len));
  return out;
}

std::vector<const char*> CPtrs(const std::vector<std::string>& v) {
  std::vector<const char*> p;
  p.reserve(v.size() + 1);
  for (const auto& s : v) p.push_back(s.c_str());
  p.push_back(nullptr);
  return p;
}

Napi::Value ArgOrUndefined(const Napi::CallbackInfo& info, size_t i) {
  return i < info.Length() ? info[i] : info.Env().Undefined();
}

std::string ArgId(const Napi::CallbackInfo& info, size_t i, const char* what) {
  std::string s = ToStr(info.Env(), ArgOrUndefined(info, i), what, 63);
  if (!wn_valid_id(s.c_str())) Invalid(info.Env(), std::string(what) + " must match ^[a-z0-9][a-z0-9-]{0,62}$");
  return s;
}

std::string ArgAbsPath(const Napi::CallbackInfo& info, size_t i, const char* what) {
  std::string s = ToStr(info.Env(), ArgOrUndefined(info, i), what);
  if (!wn_valid_abs_path(s.c_str()))
    Invalid(info.Env(), std::string(what) + " must be an absolute normalized path without '.' or '..' components");
  return s;
}

int ArgFd(const Napi::CallbackInfo& info, size_t i, const char* what) {
  return static_cast<int>(ToInt(info.Env(), ArgOrUndefined(info, i), what, 0, INT32_MAX));
}

pid_t ArgPid(const Napi::CallbackInfo& info, size_t i, const char* what) {
  return static_cast<pid_t>(ToInt(info.Env(), ArgOrUndefined(info, i), what, 1, WN_PID_MAX));
}

void ParseLimits(Napi::Env env, Napi::Value v, wn_cg_limits* l) {
  wn_cg_limits_init(l);
  if (v.IsUndefined()) return;
  Napi::Object o = ToObj(env, v, "limits");
  const int64_t big = int64_t(1) << 53;
  if (Has(o, "cpuQuotaUs")) l->cpu_quota_us = ToInt(env, o.Get("cpuQuotaUs"), "cpuQuotaUs", -1, big);
  if (Has(o, "cpuPeriodUs")) l->cpu_period_us = ToInt(env, o.Get("cpuPeriodUs"), "cpuPeriodUs", 1000, 1000000);
  if (Has(o, "memoryBytes")) l->memory_bytes = ToInt(env, o.Get("memoryBytes"), "memoryBytes", -1, big);
  if (Has(o, "memorySwapBytes")) l->memory_swap_bytes = ToInt(env, o.Get("memorySwapBytes"), "memorySwapBytes", -1, big);
  if (Has(o, "pidsMax")) l->pids_max = ToInt(env, o.Get("pidsMax"), "pidsMax", -1, WN_PID_MAX);
  wn_error e;
  if (wn_cg_limits_check(l, &e) < 0) Throw(env, e);
}

void RequireInit(Napi::Env env) {
  AddonState* st = State(env);
  if (st == nullptr || st->error_ctor.IsEmpty())
    throw Napi::Error::New(env, "warren_native: init(WarrenError) was not called (load it through src/native/index.ts)");
}

// ---- init / version ----------------------------------------------------------

Napi::Value Init(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsFunction()) throw Napi::TypeError::New(env, "init(WarrenError): a class is required");
  State(env)->error_ctor = Napi::Persistent(info[0].As<Napi::Function>());
  // The exec slots are reserved now, while this process holds few descriptors: a gateway that
  // adopts thousands of sandboxes opens a pidfd for each before its first exec.
  wn_exec_slots_reserve();
  return env.Undefined();
}

// ---- cgroups -------------------------------------------------------------------

Napi::Value CgroupLayout(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  const wn_cg_layout* l;
  wn_error e;
  if (wn_cg_layout_get(&l, &e) < 0) Throw(env, e);
  Napi::Object out = Napi::Object::New(env);
  out.Set("version", Napi::Number::New(env, l->version));
  Napi::Object roots = Napi::Object::New(env);
  for (int r = 0; r < WN_CG_NROLES; r++) {
    if (l->version == 2 && r != WN_CG_UNIFIED) continue;
    char path[512];
    if (wn_cg_path(l, r, nullptr, path, sizeof path) == 0) roots.Set(wn_cg_role_names[r], Napi::String::New(env, path));
  }
  out.Set("roots", roots);
  return out;
}

Napi::Value CgroupUpdate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  std::string name = ArgId(info, 0, "name");
  wn_cg_limits lim;
  ParseLimits(env, ArgOrUndefined(info, 1), &lim);
  wn_error e;
  if (wn_cg_update(name.c_str(), &lim, &e) < 0) Throw(env, e);
  return env.Undefined();
}

Napi::Value CgroupStats(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  std::string name = ArgId(info, 0, "name");
  wn_cg_stats st;
  wn_error e;
  if (wn_cg_stats_read(name.c_str(), &st, &e) < 0) Throw(env, e);
  Napi::Object o = Napi::Object::New(env);
  o.Set("memoryCurrentBytes", Napi::Number::New(env, static_cast<double>(st.memory_current)));
  o.Set("memoryPeakBytes", Napi::Number::New(env, static_cast<double>(st.memory_peak)));
  o.Set("oomKills", Napi::Number::New(env, static_cast<double>(st.oom_kills)));
  o.Set("cpuUsageUs", Napi::Number::New(env, static_cast<double>(st.cpu_usage_us)));
  o.Set("pidsCurrent", Napi::Number::New(env, static_cast<double>(st.pids_current)));
  o.Set("frozen", Napi::Boolean::New(env, st.frozen != 0));
  return o;
}

Napi::Value CgroupOomKills(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  std::string name = ArgId(info, 0, "name");
  uint64_t n = 0;
  wn_error e;
  if (wn_cg_oom_kills(name.c_str(), &n, &e) < 0) Throw(env, e);
  return Napi::Number::New(env, static_cast<double>(n));
}

Napi::Value CgroupProcs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  std::string name = ArgId(info, 0, "name");
  pid_t* pids = nullptr;
  size_t n = 0;
  wn_error e;
  if (wn_cg_procs(name.c_str(), &pids, &n, &e) < 0) Throw(env, e);
  std::unique_ptr<pid_t, decltype(&free)> guard(pids, &free);
  Napi::Array a = Napi::Array::New(env, n);
  for (size_t i = 0; i < n; i++) a.Set(static_cast<uint32_t>(i), Napi::Number::New(env, pids[i]));
  return a;
}

Napi::Value CgroupFreeze(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  std::string name = ArgId(info, 0, "name");
  bool frozen = ToBool(env, ArgOrUndefined(info, 1), "frozen");
  wn_error e;
  if (wn_cg_freeze(name.c_str(), frozen, &e) < 0) Throw(env, e);
  return env.Undefined();
}

Napi::Value CgroupExists(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  std::string name = ArgId(info, 0, "name");
  wn_error e;
  int r = wn_cg_exists(name.c_str(), &e);
  if (r < 0) Throw(env, e);
  return Napi::Boolean::New(env, r == 1);
}

Napi::Value CgroupAttach(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  std::string name = ArgId(info, 0, "name");
  pid_t pid = ArgPid(info, 1, "pid");
  wn_error e;
  if (wn_cg_attach(name.c_str(), pid, &e) < 0) Throw(env, e);
  return env.Undefined();
}

#include "addon_confine.inc"  // ParseConfine, LSM probes
#include "addon_bpf.inc"      // egress programs, maps, ring buffer

// ---- processes -------------------------------------------------------------------

// A parsed spawn request that owns every string the C spec points into, so it can
// run on a thread-pool thread after the JS call has returned. Never moved.
struct SpawnJob {
  std::string id, hostname, upper, work, rootfs, init, netns, shm_dir, dev_dir, mask_dir, sysfs_dir;
  std::vector<std::string> lowers;
  std::vector<const char*> lower_ptrs;
  ConfineArgs confine_args;
  wn_spawn_spec s{};
  wn_spawn_result r{};
  wn_error e{};
  int rc = 0;
};

std::unique_ptr<SpawnJob> ParseSpawn(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  auto j = std::make_unique<SpawnJob>();
  Napi::Object o = ToObj(env, ArgOrUndefined(info, 0), "spec");
  j->id = ToStr(env, o.Get("id"), "id", 63);
  j->hostname = ToStr(env, o.Get("hostname"), "hostname", 63);
  j->lowers = ToStrArray(env, o.Get("lowerDirs"), "lowerDirs", WN_MAX_LOWER_DIRS, WN_MAX_PATH);
  j->upper = ToStr(env, o.Get("upperDir"), "upperDir");
  j->work = ToStr(env, o.Get("workDir"), "workDir");
  j->rootfs = ToStr(env, o.Get("rootfsDir"), "rootfsDir");
  j->init = ToStr(env, o.Get("initPath"), "initPath");
  std::string network = ToStr(env, o.Get("network"), "network", 32);
  if (network == "netns") {
    j->netns = ToStr(env, o.Get("netnsPath"), "netnsPath");
    if (!wn_valid_abs_path(j->netns.c_str())) Invalid(env, "netnsPath must be an absolute normalized path");
  } else if (network != "loopback") {
    Invalid(env, "network must be 'loopback' or 'netns'");
  }
  bool sched_idle = ToBool(env, o.Get("schedIdle"), "schedIdle");
  bool core_sched = ToBool(env, o.Get("coreSched"), "coreSched");
  uint64_t shm = 0;
  if (Has(o, "shmBytes")) shm = static_cast<uint64_t>(ToInt(env, o.Get("shmBytes"), "shmBytes", 4096, int64_t(1) << 40));
  if (Has(o, "shmDir")) {
    j->shm_dir = ToStr(env, o.Get("shmDir"), "shmDir");
    if (!wn_valid_abs_path(j->shm_dir.c_str())) Invalid(env, "shmDir must be an absolute normalized path");
  }
  if (Has(o, "devDir")) {
    j->dev_dir = ToStr(env, o.Get("devDir"), "devDir");
    if (!wn_valid_abs_path(j->dev_dir.c_str())) Invalid(env, "devDir must be an absolute normalized path");
  }

  j->lower_ptrs = CPtrs(j->lowers);
  wn_spawn_spec& s = j->s;
  if (Has(o, "mountTemplateFd")) {
    s.has_mnt_template = 1;
    s.mnt_template_fd = static_cast<int>(ToInt(env, o.Get("mountTemplateFd"), "mountTemplateFd", 0, INT32_MAX));
  }
  if (Has(o, "maskDir")) {
    j->mask_dir = ToStr(env, o.Get("maskDir"), "maskDir");
    if (!wn_valid_abs_path(j->mask_dir.c_str())) Invalid(env, "maskDir must be an absolute normalized path");
    s.mask_dir = j->mask_dir.c_str();
  }
  if (Has(o, "sysfsDir")) {
    j->sysfs_dir = ToStr(env, o.Get("sysfsDir"), "sysfsDir");
    if (!wn_valid_abs_path(j->sysfs_dir.c_str())) Invalid(env, "sysfsDir must be an absolute normalized path");
    s.sysfs_dir = j->sysfs_dir.c_str();
  }
  s.id = j->id.c_str();
  s.hostname = j->hostname.c_str();
  s.lower_dirs = j->lower_ptrs.data();
  s.n_lower = j->lowers.size();
  s.upper_dir = j->upper.c_str();
  s.work_dir = j->work.c_str();
  s.rootfs_dir = j->rootfs.c_str();
  s.init_path = j->init.c_str();
  s.sched_idle = sched_idle;
  s.core_sched = core_sched;
  s.shm_bytes = shm;
  s.shm_dir = j->shm_dir.empty() ? nullptr : j->shm_dir.c_str();
  s.dev_dir = j->dev_dir.empty() ? nullptr : j->dev_dir.c_str();
  s.confine = ParseConfine(env, o, j->confine_args);
  s.netns_path = j->netns.empty() ? nullptr : j->netns.c_str();
  wn_error e;
  if (wn_spawn_spec_check(&s, &e) < 0) Throw(env, e);
  return j;
}

Napi::Object SpawnResult(Napi::Env env, const wn_spawn_result& r) {
  Napi::Object out = Napi::Object::New(env);
  out.Set("pid", Napi::Number::New(env, r.pid));
  out.Set("pidfd", Napi::Number::New(env, r.pidfd));
  out.Set("startTime", Napi::Number::New(env, static_cast<double>(r.start_time)));
  return out;
}

Napi::Value SpawnSandbox(const Napi::CallbackInfo& info) {
  std::unique_ptr<SpawnJob> j = ParseSpawn(info);
  if (wn_spawn_sandbox(&j->s, &j->r, &j->e) < 0) Throw(info.Env(), j->e);
  return SpawnResult(info.Env(), j->r);
}

/*
 * The clone(CLONE_VM|CLONE_VFORK) child suspends the calling thread until it
 * execs; the sandbox set-up it does first (mounts, pivot_root) takes
 * milliseconds. Run on the libuv thread pool, that wait no longer stalls the
 * event loop, and several creates proceed in parallel.
 */
template <typename Job, typename Run, typename Done>
class JobWorker : public Napi::AsyncWorker {
 public:
  JobWorker(Napi::Env env, std::unique_ptr<Job> job, Run run, Done done)
      : Napi::AsyncWorker(env, "warren-native"), deferred_(Napi::Promise::Deferred::New(env)), job_(std::move(job)), run_(run), done_(done) {}
  Napi::Promise Promise() { return deferred_.Promise(); }

 protected:
  void Execute() override { job_->rc = run_(*job_); }
  void OnOK() override {
    Napi::Env env = Env();
    if (job_->rc < 0) {
      deferred_.Reject(ErrorValue(env, wn_code_name(job_->e.code), job_->e.msg, job_->e.errnum));
      return;
    }
    deferred_.Resolve(done_(env, *job_));
  }
  void OnError(const Napi::Error& err) override { deferred_.Reject(err.Value()); }

 private:
  Napi::Promise::Deferred deferred_;
  std::unique_ptr<Job> job_;
  Run run_;
  Done done_;
};

template <typename Job, typename Run, typename Done>
Napi::Value Queue(Napi::Env env, std::unique_ptr<Job> job, Run run, Done done) {
  auto* w = new JobWorker<Job, Run, Done>(env, std::move(job), run, done);
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

Napi::Value SpawnSandboxAsync(const Napi::CallbackInfo& info) {
  return Queue(
      info.Env(), ParseSpawn(info), [](SpawnJob& j) { return wn_spawn_sandbox(&j.s, &j.r, &j.e); },
      [](Napi::Env env, SpawnJob& j) -> Napi::Value { return SpawnResult(env, j.r); });
}

// A parsed exec request that owns every string the C spec points into (see SpawnJob).
struct ExecJob {
  ExecJob() = default;
  ExecJob(const ExecJob&) = delete;
  ExecJob& operator=(const ExecJob&) = delete;
  ~ExecJob() {
    if (confine_args.c.ll_have_ruleset) close(confine_args.c.ll_ruleset_fd);
  }
  // Attach the cached Landlock ruleset (LlAttach), then run the exec: on whichever thread runs it.
  int Run() {
    if (ll_attach) LlAttach(cgroup, init_pid, confine_args.c);
    return wn_exec(&s, &r, &e);
  }
  bool ll_attach = false;
  pid_t init_pid = 0;
  std::string cgroup, cwd;
  std::vector<std::string> argv, envv;
  std::vector<const char*> argv_ptrs, env_ptrs;
  ConfineArgs confine_args;
  wn_isolate iso{};
  std::vector<std::string> iso_strs;
  wn_exec_spec s{};
  wn_exec_result r{};
  wn_error e{};
  int rc = 0;
};

std::unique_ptr<ExecJob> ParseExec(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  auto j = std::make_unique<ExecJob>();
  Napi::Object o = ToObj(env, ArgOrUndefined(info, 0), "spec");
  pid_t init_pid = static_cast<pid_t>(ToInt(env, o.Get("initPid"), "initPid", 1, WN_PID_MAX));
  j->cgroup = ToStr(env, o.Get("cgroup"), "cgroup", 63);
  j->argv = ToStrArray(env, o.Get("argv"), "argv", WN_MAX_ARGS, WN_MAX_ARG_LEN);
  j->envv = ToStrArray(env, o.Get("env"), "env", WN_MAX_ARGS, WN_MAX_ARG_LEN);
  j->cwd = ToStr(env, o.Get("cwd"), "cwd");
  uid_t uid = static_cast<uid_t>(ToInt(env, o.Get("uid"), "uid", 0, 4294967294LL));
  gid_t gid = static_cast<gid_t>(ToInt(env, o.Get("gid"), "gid", 0, 4294967294LL));
  bool sched_idle = ToBool(env, o.Get("schedIdle"), "schedIdle");
  bool status_pipe = Has(o, "statusPipe") && ToBool(env, o.Get("statusPipe"), "statusPipe");
  bool status_socket = Has(o, "statusSocket") && ToBool(env, o.Get("statusSocket"), "statusSocket");

  wn_exec_spec& s = j->s;
  s.stdio = WN_STDIO_PIPES;
  if (Has(o, "pty")) {
    Napi::Object pty = ToObj(env, o.Get("pty"), "pty");
    s.stdio = WN_STDIO_PTY;
    s.pty_cols = static_cast<int>(ToInt(env, pty.Get("cols"), "pty.cols", 1, 10000));
    s.pty_rows = static_cast<int>(ToInt(env, pty.Get("rows"), "pty.rows", 1, 10000));
  }
  j->argv_ptrs = CPtrs(j->argv);
  j->env_ptrs = CPtrs(j->envv);
  s.init_pid = init_pid;
  s.cgroup = j->cgroup.c_str();
  s.argv = j->argv_ptrs.data();
  s.argc = j->argv.size();
  s.envp = j->env_ptrs.data();
  s.envc = j->envv.size();
  s.cwd = j->cwd.c_str();
  s.uid = uid;
  s.gid = gid;
  s.sched_idle = sched_idle;
  s.status_pipe = status_pipe;
  s.status_socket = status_socket;
  s.confine = ParseConfine(env, o, j->confine_args);
  // cached Landlock ruleset; not for isolated execs (their child builds its own mount namespace,
  // where the rules must be resolved)
  j->ll_attach = s.confine && !Has(o, "isolate");
  j->init_pid = init_pid;
  // FnCall per-invocation isolation (isolate.h). The strings live in iso_strs (reserved: no reallocation).
  wn_isolate& iso = j->iso;
  std::vector<std::string>& iso_strs = j->iso_strs;
  iso_strs.reserve(5 * WN_ISO_MAX_PATHS);
  if (Has(o, "isolate")) {
    Napi::Object io = ToObj(env, o.Get("isolate"), "isolate");
    iso.ipc = Has(io, "ipc") && ToBool(env, io.Get("ipc"), "isolate.ipc");
    iso.ro_root = Has(io, "readOnlyRoot") && ToBool(env, io.Get("readOnlyRoot"), "isolate.readOnlyRoot");
    if (Has(io, "writable")) {
      for (auto& p : ToStrArray(env, io.Get("writable"), "isolate.writable", WN_ISO_MAX_PATHS, WN_MAX_PATH)) {
        iso_strs.push_back(p);
        iso.writable[iso.n_writable++] = iso_strs.back().c_str();
      }
    }
    if (Has(io, "tmpfs")) {
      Napi::Value tv = io.Get("tmpfs");
      if (!tv.IsArray()) Invalid(env, "isolate.tmpfs must be an array");
      Napi::Array ta = tv.As<Napi::Array>();
      if (ta.Length() > WN_ISO_MAX_PATHS) Invalid(env, "isolate.tmpfs has more than 16 entries");
      for (uint32_t i = 0; i < ta.Length(); i++) {
        Napi::Object t = ToObj(env, ta.Get(i), "isolate.tmpfs[]");
        std::string path = ToStr(env, t.Get("path"), "isolate.tmpfs[].path");
        int64_t size = ToInt(env, t.Get("sizeBytes"), "isolate.tmpfs[].sizeBytes", 4096, int64_t(1) << 40);
        int64_t mode = ToInt(env, t.Get("mode"), "isolate.tmpfs[].mode", 0, 07777);
        int64_t uid = Has(t, "uid") ? ToInt(env, t.Get("uid"), "isolate.tmpfs[].uid", 0, 4294967294LL) : 0;
        int64_t gid = Has(t, "gid") ? ToInt(env, t.Get("gid"), "isolate.tmpfs[].gid", 0, 4294967294LL) : 0;
        char data[96];
        snprintf(data, sizeof data, "size=%lld,mode=%llo,uid=%lld,gid=%lld", (long long)size, (long long)mode, (long long)uid, (long long)gid);
        iso_strs.push_back(path);
        iso.tmpfs[iso.n_tmpfs] = iso_strs.back().c_str();
        iso_strs.push_back(data);
        iso.tmpfs_data[iso.n_tmpfs] = iso_strs.back().c_str();
        iso.n_tmpfs++;
      }
    }
    if (Has(io, "binds")) {
      Napi::Value bv = io.Get("binds");
      if (!bv.IsArray()) Invalid(env, "isolate.binds must be an array");
      Napi::Array ba = bv.As<Napi::Array>();
      if (ba.Length() > WN_ISO_MAX_PATHS) Invalid(env, "isolate.binds has more than 16 entries");
      for (uint32_t i = 0; i < ba.Length(); i++) {
        Napi::Object b = ToObj(env, ba.Get(i), "isolate.binds[]");
        iso_strs.push_back(ToStr(env, b.Get("source"), "isolate.binds[].source"));
        iso.bind_src[iso.n_binds] = iso_strs.back().c_str();
        iso_strs.push_back(ToStr(env, b.Get("target"), "isolate.binds[].target"));
        iso.bind_dst[iso.n_binds] = iso_strs.back().c_str();
        iso.n_binds++;
      }
    }
    iso.net = Has(io, "net") && ToBool(env, io.Get("net"), "isolate.net");
    iso.in_place = Has(io, "inPlace") && ToBool(env, io.Get("inPlace"), "isolate.inPlace");
    iso.mount_ns = !iso.in_place && (iso.ro_root || iso.n_writable > 0 || iso.n_tmpfs > 0 || iso.n_binds > 0);
    iso.rl_cpu_s = iso.rl_fsize = iso.rl_core = iso.rl_nofile = -1;
    if (Has(io, "rlimits")) {
      Napi::Object rl = ToObj(env, io.Get("rlimits"), "isolate.rlimits");
      if (Has(rl, "cpuSeconds")) iso.rl_cpu_s = ToInt(env, rl.Get("cpuSeconds"), "isolate.rlimits.cpuSeconds", 1, 86400 * 365);
      if (Has(rl, "fileSizeBytes")) iso.rl_fsize = ToInt(env, rl.Get("fileSizeBytes"), "isolate.rlimits.fileSizeBytes", 0, int64_t(1) << 50);
      if (Has(rl, "coreBytes")) iso.rl_core = ToInt(env, rl.Get("coreBytes"), "isolate.rlimits.coreBytes", 0, int64_t(1) << 50);
      if (Has(rl, "openFiles")) iso.rl_nofile = ToInt(env, rl.Get("openFiles"), "isolate.rlimits.openFiles", 16, 1048576);
    }
    s.isolate = &iso;
  }
  wn_error e;
  if (wn_exec_spec_check(&s, &e) < 0) Throw(env, e);
  return j;
}

Napi::Object ExecResult(Napi::Env env, const wn_exec_result& r) {
  Napi::Object out = Napi::Object::New(env);
  out.Set("pid", Napi::Number::New(env, r.pid));
  out.Set("pidfd", Napi::Number::New(env, r.pidfd));
  if (r.stdin_fd >= 0) out.Set("stdin", Napi::Number::New(env, r.stdin_fd));
  if (r.stdout_fd >= 0) out.Set("stdout", Napi::Number::New(env, r.stdout_fd));
  if (r.stderr_fd >= 0) out.Set("stderr", Napi::Number::New(env, r.stderr_fd));
  if (r.status_fd >= 0) out.Set("status", Napi::Number::New(env, r.status_fd));
  if (r.pty_fd >= 0) out.Set("ptyFd", Napi::Number::New(env, r.pty_fd));
  return out;
}

Napi::Value Exec(const Napi::CallbackInfo& info) {
  std::unique_ptr<ExecJob> j = ParseExec(info);
  if (j->Run() < 0) Throw(info.Env(), j->e);
  return ExecResult(info.Env(), j->r);
}

Napi::Value ExecAsync(const Napi::CallbackInfo& info) {
  return Queue(
      info.Env(), ParseExec(info), [](ExecJob& j) { return j.Run(); },
      [](Napi::Env env, ExecJob& j) -> Napi::Value { return ExecResult(env, j.r); });
}

// ---- prefetch ---------------------------------------------------------------------------

struct PrefetchJob {
  pid_t pid = 0;
  int mode = 0;
  uint64_t bytes = 0;
  wn_error e{};
  int rc = 0;
};

Napi::Value PrefetchAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  auto j = std::make_unique<PrefetchJob>();
  j->pid = static_cast<pid_t>(ToInt(env, ArgOrUndefined(info, 0), "pid", 1, WN_PID_MAX));
  std::string mode = ToStr(env, ArgOrUndefined(info, 1), "mode", 16);
  if (mode == "touch") j->mode = WN_PREFETCH_TOUCH;
  else if (mode == "willneed") j->mode = WN_PREFETCH_WILLNEED;
  else Invalid(env, "mode must be 'touch' or 'willneed'");
  return Queue(
      env, std::move(j), [](PrefetchJob& p) { return wn_prefetch(p.pid, p.mode, &p.bytes, &p.e); },
      [](Napi::Env env, PrefetchJob& p) -> Napi::Value {
        Napi::Object out = Napi::Object::New(env);
        out.Set("bytes", Napi::Number::New(env, static_cast<double>(p.bytes)));
        return out;
      });
}

Napi::Value PageoutAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  auto j = std::make_unique<PrefetchJob>();
  j->pid = static_cast<pid_t>(ToInt(env, ArgOrUndefined(info, 0), "pid", 1, WN_PID_MAX));
  return Queue(
      env, std::move(j), [](PrefetchJob& p) { return wn_pageout(p.pid, &p.bytes, &p.e); },
      [](Napi::Env env, PrefetchJob& p) -> Napi::Value {
        Napi::Object out = Napi::Object::New(env);
        out.Set("bytes", Napi::Number::New(env, static_cast<double>(p.bytes)));
        return out;
      });
}

// ---- watchExit ------------------------------------------------------------------------

struct Watcher {
  uv_poll_t poll;
  int fd = -1;  // our dup of the caller's pidfd, or the caller's own one (owned)
  napi_env env = nullptr;
  AddonState* state = nullptr;
  Napi::FunctionReference callback;
  std::unique_ptr<Napi::AsyncContext> async;
};

void WatcherClosed(uv_handle_t* h) {
  Watcher* w = static_cast<Watcher*>(h->data);
  if (w->fd >= 0) close(w->fd);
  delete w;
}

void StopWatcher(Watcher* w) {
  w->state->watchers.erase(w);
  uv_poll_stop(&w->poll);
  uv_close(reinterpret_cast<uv_handle_t*>(&w->poll), WatcherClosed);
}

void OnPidfdReadable(uv_poll_t* handle, int status, int events) {
  Watcher* w = static_cast<Watcher*>(handle->data);
  siginfo_t si;
  memset(&si, 0, sizeof si);
  int r = waitid(P_PIDFD, static_cast<id_t>(w->fd), &si, WEXITED | WNOHANG);
  if (status == 0 && r == 0 && si.si_pid == 0) return;  // not exited yet (spurious wakeup)
  bool known = status == 0 && r == 0;
  int exit_code = -1, sig = -1;
  if (known) {
    if (si.si_code == CLD_EXITED)
      exit_code = si.si_status;
    else
      sig = si.si_status;
  }
  Napi::Env env(w->env);
  Napi::FunctionReference cb = std::move(w->callback);
  std::unique_ptr<Napi::AsyncContext> async = std::move(w->async);
  StopWatcher(w);
  if (cb.IsEmpty()) return;
  Napi::HandleScope scope(env);
  Napi::Object st = Napi::Object::New(env);
  st.Set("exitCode", exit_code >= 0 ? Napi::Value(Napi::Number::New(env, exit_code)) : env.Null());
  st.Set("signal", sig >= 0 ? Napi::Value(Napi::Number::New(env, sig)) : env.Null());
  try {
    cb.MakeCallback(env.Global(), {st}, *async);
  } catch (const Napi::Error& err) {
    napi_fatal_exception(env, err.Value());
  }
}

Napi::Value WatchExit(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  int pidfd = ArgFd(info, 0, "pidfd");
  if (info.Length() < 2 || !info[1].IsFunction()) Invalid(env, "callback must be a function");
  // owned: the watcher takes the caller's pidfd and closes it once the process has exited
  // (one descriptor per watched process instead of two); the caller must not close it.
  bool owned = info.Length() > 2 && ToBool(env, info[2], "owned");
  AddonState* st = State(env);
  uv_loop_t* loop = nullptr;
  if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == nullptr)
    ThrowCode(env, "NATIVE_ERROR", "no libuv loop", 0);
  if (pidfd < 3) Invalid(env, "pidfd must not be a stdio descriptor");
  int fd = owned ? pidfd : fcntl(pidfd, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) ThrowCode(env, errno == EMFILE || errno == ENFILE ? "NODE_AT_CAPACITY" : "NATIVE_ERROR", std::string("watchExit: dup pidfd: ") + wn_errno_name(errno), errno);
  auto w = std::make_unique<Watcher>();
  w->fd = fd;
  w->env = env;
  w->state = st;
  w->callback = Napi::Persistent(info[1].As<Napi::Function>());
  w->async = std::make_unique<Napi::AsyncContext>(env, "warren.watchExit");
  int rc = uv_poll_init(loop, &w->poll, fd);
  if (rc < 0) {
    close(fd);
    ThrowCode(env, "NATIVE_ERROR", std::string("watchExit: uv_poll_init: ") + uv_strerror(rc), -rc);
  }
  w->poll.data = w.get();
  rc = uv_poll_start(&w->poll, UV_READABLE, OnPidfdReadable);
  if (rc < 0) {
    Watcher* raw = w.release();
    raw->callback.Reset();
    uv_close(reinterpret_cast<uv_handle_t*>(&raw->poll), WatcherClosed);
    ThrowCode(env, "NATIVE_ERROR", std::string("watchExit: uv_poll_start: ") + uv_strerror(rc), -rc);
  }
  st->watchers.insert(w.release());
  return env.Undefined();
}

#include "addon_zygote.inc"  // zygoteSpawn, zygoteWatch

// ---- small process helpers ------------------------------------------------------------

Napi::Value PidfdOpen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  pid_t pid = ArgPid(info, 0, "pid");
  int fd = wn_pidfd_open(pid, 0);
  if (fd < 0) THROW_ERRNO(env, "pidfd_open %d", static_cast<int>(pid));
  return Napi::Number::New(env, fd);
}

Napi::Value PidfdSendSignal(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  int fd = ArgFd(info, 0, "pidfd");
  int sig = static_cast<int>(ToInt(env, ArgOrUndefined(info, 1), "signal", 0, 64));
  if (wn_pidfd_send_signal(fd, sig) < 0) THROW_ERRNO(env, "pidfd_send_signal %d to pidfd %d", sig, fd);
  return env.Undefined();
}

Napi::Value ProcessStartTime(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  pid_t pid = ArgPid(info, 0, "pid");
  uint64_t t = 0;
  wn_error e;
  if (wn_process_start_time(pid, &t, &e) < 0) Throw(env, e);
  return Napi::Number::New(env, static_cast<double>(t));
}

// Hand the memory of a burst back to the kernel. Buffers that became garbage
// stay allocated until V8 collects them, which an idle process may not do for
// a long time; and glibc keeps freed pages in its arenas (the queues of many
// slow clients leave the process at its peak size long after they are freed).
// With `collect`, a full collection first (synchronous: tens of ms for a heap
// of tens of MiB); then malloc_trim(0), which also releases free pages in the
// middle of the heap.
Napi::Value ReclaimMemory(const Napi::CallbackInfo& info) {
  bool collect = info.Length() > 0 && info[0].IsBoolean() && info[0].As<Napi::Boolean>().Value();
  if (collect) {
    v8::Isolate* isolate = v8::Isolate::GetCurrent();
    if (isolate != nullptr) isolate->MemoryPressureNotification(v8::MemoryPressureLevel::kCritical);
  }
  return Napi::Boolean::New(info.Env(), malloc_trim(0) != 0);
}

Napi::Value PtyResize(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  int fd = ArgFd(info, 0, "ptyFd");
  int cols = static_cast<int>(ToInt(env, ArgOrUndefined(info, 1), "cols", 1, 10000));
  int rows = static_cast<int>(ToInt(env, ArgOrUndefined(info, 2), "rows", 1, 10000));
  wn_error e;
  if (wn_pty_resize(fd, cols, rows, &e) < 0) Throw(env, e);
  return env.Undefined();
}

Napi::Value Close(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  int fd = ArgFd(info, 0, "fd");
  if (fd < 3) Invalid(env, "refusing to close stdio fd " + std::to_string(fd));
  if (close(fd) < 0 && errno != EINTR) THROW_ERRNO(env, "close fd %d", fd);
  return env.Undefined();
}

// A sealed memfd: what several processes map copy-on-write and none of them can change.
Napi::Value MemfdCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  std::string name = ToStr(env, ArgOrUndefined(info, 0), "name", 200);
  int64_t size = ToInt(env, ArgOrUndefined(info, 1), "size", 0, int64_t(1) << 40);
  int fd = static_cast<int>(syscall(SYS_memfd_create, name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd < 0) THROW_ERRNO(env, "memfd_create");
  if (ftruncate(fd, static_cast<off_t>(size)) < 0) {
    wn_error e;
    wn_fail_errno(&e, WN_NATIVE_ERROR, "ftruncate memfd to %lld", static_cast<long long>(size));
    close(fd);
    Throw(env, e);
  }
  return Napi::Number::New(env, fd);
}

// No more writes, shared writable mappings, size changes or seal changes: private mappings stay writable.
Napi::Value MemfdSeal(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  int fd = ArgFd(info, 0, "fd");
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) THROW_ERRNO(env, "seal memfd %d", fd);
  return env.Undefined();
}

// ---- filesystem ------------------------------------------------------------------------

// Optional { uid, gid, groups? }: the identity the file access runs with (rootfs.c).
static bool ArgCreds(const Napi::CallbackInfo& info, size_t i, wn_creds* cr) {
  Napi::Env env = info.Env();
  Napi::Value v = ArgOrUndefined(info, i);
  if (v.IsUndefined() || v.IsNull()) return false;
  if (!v.IsObject()) Invalid(env, "creds must be an object { uid, gid, groups? }");
  Napi::Object o = v.As<Napi::Object>();
  cr->uid = static_cast<uid_t>(ToInt(env, o.Get("uid"), "creds.uid", 0, 0xfffffffe));
  cr->gid = static_cast<gid_t>(ToInt(env, o.Get("gid"), "creds.gid", 0, 0xfffffffe));
  cr->n_groups = 0;
  if (Has(o, "groups")) {
    Napi::Value g = o.Get("groups");
    if (!g.IsArray()) Invalid(env, "creds.groups must be an array");
    Napi::Array a = g.As<Napi::Array>();
    if (a.Length() > WN_MAX_GROUPS) Invalid(env, "creds.groups: at most 64 groups");
    for (uint32_t k = 0; k < a.Length(); k++) cr->groups[cr->n_groups++] = static_cast<gid_t>(ToInt(env, a.Get(k), "creds.groups[]", 0, 0xfffffffe));
  }
  return true;
}

Napi::Value OpenInRoot(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  std::string root = ArgAbsPath(info, 0, "rootDir");
  std::string path = ToStr(env, ArgOrUndefined(info, 1), "path");
  std::string flags = ToStr(env, ArgOrUndefined(info, 2), "flags", 8);
  int how;
  if (flags == "r")
    how = WN_OPEN_READ;
  else if (flags == "w")
    how = WN_OPEN_WRITE;
  else if (flags == "a")
    how = WN_OPEN_APPEND;
  else if (flags == "dir")
    how = WN_OPEN_DIR;
  else
    Invalid(env, "flags must be 'r', 'w', 'a' or 'dir'");
  mode_t mode = static_cast<mode_t>(ToInt(env, ArgOrUndefined(info, 3), "mode", 0, 07777));
  wn_creds cr;
  bool have = ArgCreds(info, 4, &cr);
  wn_error e;
  int fd = wn_open_in_root(root.c_str(), path.c_str(), how, mode, have ? &cr : nullptr, &e);
  if (fd < 0) Throw(env, e);
  return Napi::Number::New(env, fd);
}

Napi::Value MkdirInRoot(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  std::string root = ArgAbsPath(info, 0, "rootDir");
  std::string path = ToStr(env, ArgOrUndefined(info, 1), "path");
  mode_t mode = static_cast<mode_t>(ToInt(env, ArgOrUndefined(info, 2), "mode", 0, 07777));
  bool recursive = ToBool(env, ArgOrUndefined(info, 3), "recursive");
  wn_creds cr;
  bool have = ArgCreds(info, 4, &cr);
  wn_error e;
  if (wn_mkdir_in_root(root.c_str(), path.c_str(), mode, recursive, have ? &cr : nullptr, &e) < 0) Throw(env, e);
  return env.Undefined();
}

// ---- mounts ------------------------------------------------------------------------------

Napi::Value Mount(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  std::string source = ToStr(env, ArgOrUndefined(info, 0), "source");
  std::string target = ArgAbsPath(info, 1, "target");
  std::string fstype = ToStr(env, ArgOrUndefined(info, 2), "fstype", 32);
  std::vector<std::string> flags = ToStrArray(env, ArgOrUndefined(info, 3), "flags", 16, 16);
  std::string data = ToStr(env, ArgOrUndefined(info, 4), "data", 4095);
  unsigned f = 0;
  for (const auto& fl : flags) {
    if (fl == "ro")
      f |= WN_MNT_RO;
    else if (fl == "nosuid")
      f |= WN_MNT_NOSUID;
    else if (fl == "nodev")
      f |= WN_MNT_NODEV;
    else if (fl == "noexec")
      f |= WN_MNT_NOEXEC;
    else if (fl == "bind")
      f |= WN_MNT_BIND;
    else if (fl == "rec")
      f |= WN_MNT_REC;
    else if (fl == "private")
      f |= WN_MNT_PRIVATE;
    else
      Invalid(env, "unknown mount flag '" + fl + "'");
  }
  wn_error e;
  if (wn_mount(source.c_str(), target.c_str(), fstype.c_str(), f, data.c_str(), &e) < 0) Throw(env, e);
  return env.Undefined();
}

Napi::Value MountTemplateCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  std::vector<std::string> keep = ToStrArray(env, ArgOrUndefined(info, 0), "keep", 16, WN_MAX_PATH);
  std::vector<const char*> ptrs = CPtrs(keep);
  std::string mask, sysfs;
  if (info.Length() > 1 && !info[1].IsUndefined()) mask = ArgAbsPath(info, 1, "mask");
  if (info.Length() > 2 && !info[2].IsUndefined()) sysfs = ArgAbsPath(info, 2, "sysfs");
  wn_error e;
  int fd = wn_mnt_template_create(ptrs.data(), keep.size(), mask.empty() ? nullptr : mask.c_str(), sysfs.empty() ? nullptr : sysfs.c_str(), &e);
  if (fd < 0) Throw(env, e);
  return Napi::Number::New(env, fd);
}

// Cgroup and mount calls that wait on the kernel: an unmount for an RCU grace period
// (namespace_unlock), a cgroup rmdir for the memory controller's offlining, a v1 kill for the
// freeze, a create for a mkdir and limit writes per hierarchy. Each is on every create or
// delete and takes milliseconds on a node of thousands, so each also has an Async variant on
// the thread pool; both variants share the parsing and the call.
struct PathJob {
  std::string arg;
  bool flag = false;
  wn_cg_limits lim{};
  wn_error e{};
  int rc = 0;
};

// The Queue of a call made right here: run the job and throw its error.
template <typename Job, typename Run, typename Done>
Napi::Value RunHere(Napi::Env env, std::unique_ptr<Job> job, Run run, Done done) {
  job->rc = run(*job);
  if (job->rc < 0) Throw(env, job->e);
  return done(env, *job);
}

std::unique_ptr<PathJob> CgroupJob(const Napi::CallbackInfo& info, bool limits) {
  RequireInit(info.Env());
  auto j = std::make_unique<PathJob>();
  j->arg = ArgId(info, 0, "name");
  if (limits) ParseLimits(info.Env(), ArgOrUndefined(info, 1), &j->lim);
  return j;
}

std::unique_ptr<PathJob> UmountJob(const Napi::CallbackInfo& info) {
  RequireInit(info.Env());
  auto j = std::make_unique<PathJob>();
  j->arg = ArgAbsPath(info, 0, "target");
  j->flag = ToBool(info.Env(), ArgOrUndefined(info, 1), "detach");
  return j;
}

int RunCgroupCreate(PathJob& j) { return wn_cg_create(j.arg.c_str(), &j.lim, &j.e); }
int RunCgroupKill(PathJob& j) { return wn_cg_kill(j.arg.c_str(), &j.e); }
int RunCgroupDestroy(PathJob& j) { return wn_cg_destroy(j.arg.c_str(), &j.e); }
int RunUmount(PathJob& j) { return wn_umount(j.arg.c_str(), j.flag, &j.e); }
Napi::Value NoValue(Napi::Env env, PathJob&) { return env.Undefined(); }
Napi::Value Killed(Napi::Env env, PathJob& j) { return Napi::Number::New(env, j.rc); }

Napi::Value CgroupCreate(const Napi::CallbackInfo& info) { return RunHere(info.Env(), CgroupJob(info, true), RunCgroupCreate, NoValue); }
Napi::Value CgroupCreateAsync(const Napi::CallbackInfo& info) { return Queue(info.Env(), CgroupJob(info, true), RunCgroupCreate, NoValue); }
Napi::Value CgroupKill(const Napi::CallbackInfo& info) { return RunHere(info.Env(), CgroupJob(info, false), RunCgroupKill, Killed); }
Napi::Value CgroupKillAsync(const Napi::CallbackInfo& info) { return Queue(info.Env(), CgroupJob(info, false), RunCgroupKill, Killed); }
Napi::Value CgroupDestroy(const Napi::CallbackInfo& info) { return RunHere(info.Env(), CgroupJob(info, false), RunCgroupDestroy, NoValue); }
Napi::Value CgroupDestroyAsync(const Napi::CallbackInfo& info) { return Queue(info.Env(), CgroupJob(info, false), RunCgroupDestroy, NoValue); }
Napi::Value Umount(const Napi::CallbackInfo& info) { return RunHere(info.Env(), UmountJob(info), RunUmount, NoValue); }
Napi::Value UmountAsync(const Napi::CallbackInfo& info) { return Queue(info.Env(), UmountJob(info), RunUmount, NoValue); }

// ---- scheduling -----------------------------------------------------------------------------

Napi::Value CoreSchedSupported(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), wn_core_sched_supported() != 0);
}

Napi::Value SetSchedIdle(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireInit(env);
  pid_t pid = ArgPid(info, 0, "pid");
  wn_error e;
  if (wn_set_sched_idle(pid, &e) < 0) Throw(env, e);
  return env.Undefined();
}

// ---- module ----------------------------------------------------------------------------------

void Cleanup(AddonState* st) {
  st->closing = true;
  std::set<Watcher*> ws;
  ws.swap(st->watchers);
  for (Watcher* w : ws) {
    w->callback.Reset();
    w->async.reset();
    uv_poll_stop(&w->poll);
    uv_close(reinterpret_cast<uv_handle_t*>(&w->poll), WatcherClosed);
  }
  std::set<ZWatcher*> zs;
  zs.swap(st->zwatchers);
  for (ZWatcher* w : zs) {
    w->callback.Reset();
    w->async.reset();
    uv_poll_stop(&w->poll);
    uv_close(reinterpret_cast<uv_handle_t*>(&w->poll), ZWatcherClosed);
  }
}

Napi::Object InitModule(Napi::Env env, Napi::Object exports) {
  auto* st = new AddonState();
  env.SetInstanceData<AddonState>(st);
  env.AddCleanupHook(Cleanup, st);

  exports.Set("version", Napi::String::New(env, kVersion));
  struct Fn {
    const char* name;
    Napi::Value (*fn)(const Napi::CallbackInfo&);
  };
  static const Fn fns[] = {
      {"init", Init},
      {"cgroupLayout", CgroupLayout},
      {"cgroupCreate", CgroupCreate},
      {"cgroupUpdate", CgroupUpdate},
      {"cgroupStats", CgroupStats},
      {"cgroupOomKills", CgroupOomKills},
      {"cgroupProcs", CgroupProcs},
      {"cgroupFreeze", CgroupFreeze},
      {"cgroupKill", CgroupKill},
      {"cgroupDestroy", CgroupDestroy},
      {"cgroupExists", CgroupExists},
      {"cgroupAttach", CgroupAttach},
      {"spawnSandbox", SpawnSandbox},
      {"exec", Exec},
      {"spawnSandboxAsync", SpawnSandboxAsync},
      {"execAsync", ExecAsync},
      {"watchExit", WatchExit},
      {"zygoteSpawn", ZygoteSpawn},
      {"zygoteWatch", ZygoteWatch},
      {"prefetchAsync", PrefetchAsync},
      {"pageoutAsync", PageoutAsync},
      {"pidfdOpen", PidfdOpen},
      {"pidfdSendSignal", PidfdSendSignal},
      {"processStartTime", ProcessStartTime},
      {"ptyResize", PtyResize},
      {"close", Close},
      {"memfdCreate", MemfdCreate},
      {"memfdSeal", MemfdSeal},
      {"openInRoot", OpenInRoot},
      {"mkdirInRoot", MkdirInRoot},
      {"mount", Mount},
      {"umount", Umount},
      {"umountAsync", UmountAsync},
      {"cgroupDestroyAsync", CgroupDestroyAsync},
      {"cgroupCreateAsync", CgroupCreateAsync},
      {"cgroupKillAsync", CgroupKillAsync},
      {"mountTemplateCreate", MountTemplateCreate},
      {"coreSchedSupported", CoreSchedSupported},
      {"setSchedIdle", SetSchedIdle},
      {"landlockAbi", LandlockAbi},
      {"seccompSupported", SeccompSupported},
      {"bpfLsmProbe", BpfLsmProbe},
      {"seccompFilterLength", SeccompFilterLength},
      {"landlockCacheDrop", LandlockCacheDrop},
      {"bpfLoadPinned", BpfLoadPinned},
      {"bpfAttachCgroup", BpfAttachCgroup},
      {"bpfAttachTap", BpfAttachTap},
      {"bpfObjGet", BpfObjGet},
      {"bpfMapInfo", BpfMapInfo},
      {"bpfMapUpdate", BpfMapUpdate},
      {"bpfMapDelete", BpfMapDelete},
      {"bpfMapLookup", BpfMapLookup},
      {"bpfMapNextKey", BpfMapNextKey},
      {"bpfRingbufOpen", BpfRingbufOpen},
      {"bpfRingbufDrain", BpfRingbufDrain},
      {"bpfRingbufClose", BpfRingbufClose},
      {"reclaimMemory", ReclaimMemory},
  };
  for (const auto& f : fns) exports.Set(f.name, Napi::Function::New(env, f.fn, f.name));
  return exports;
}

}  // namespace

NODE_API_MODULE(warren_native, InitModule)
