#include <loom/runtime/launch_env.hpp>

#include <loom/base/text.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace loom {
namespace {

constexpr std::array launcher_variables{"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};

[[noreturn]] void reject(const char* name, std::string_view value, std::string_view expected) {
  throw_error<launch_error>("{}=\"{}\" is invalid: expected {}", name, value, expected);
}

long long parse_integer(const char* name, std::string_view text, long long low, long long high,
                        std::string_view expected) {
  long long value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size() || value < low || value > high) {
    reject(name, text, expected);
  }
  return value;
}

class reader {
 public:
  explicit reader(const env_lookup& lookup) : lookup_(lookup) {}

  std::optional<std::string> get(const char* name) const { return lookup_(name); }

  std::string require(const char* name, std::string_view why) const {
    auto value = lookup_(name);
    if (!value || value->empty()) {
      throw_error<launch_error>("{} is not set, but {}: start the program with loom-run or torchrun, which set it",
                                name, why);
    }
    return *value;
  }

  int integer(const char* name, long long low, long long high, std::string_view expected, std::optional<int> fallback,
              std::string_view why) const {
    auto value = lookup_(name);
    if (!value && fallback) return *fallback;
    std::string text = value ? *value : require(name, why);
    return static_cast<int>(parse_integer(name, text, low, high, expected));
  }

 private:
  const env_lookup& lookup_;
};

// A number of seconds, in milliseconds, no more than 1e7; zero only where `zero_allowed`.
std::chrono::milliseconds parse_seconds(const reader& env, const char* name, std::chrono::milliseconds fallback,
                                        std::string_view expected, bool zero_allowed) {
  auto text = env.get(name);
  if (!text) return fallback;
  char* end = nullptr;
  double seconds = std::strtod(text->c_str(), &end);
  if (text->empty() || end != text->c_str() + text->size() || !std::isfinite(seconds) || seconds < 0 ||
      (seconds == 0 && !zero_allowed) || seconds > 1e7) {
    reject(name, *text, expected);
  }
  return std::chrono::milliseconds(static_cast<long long>(std::ceil(seconds * 1000)));
}

std::optional<backend_kind> parse_backend(const reader& env) {
  auto text = env.get("LOOM_BACKEND");
  if (!text || text->empty()) return std::nullopt;
  if (*text == "gloo") return backend_kind::gloo;
  if (*text == "nccl") return backend_kind::nccl;
  reject("LOOM_BACKEND", *text, "gloo (CPU tensors) or nccl (CUDA tensors)");
}

std::optional<device_request> parse_device(const reader& env) {
  auto text = env.get("LOOM_DEVICE");
  if (!text || text->empty()) return std::nullopt;
  const char* expected = "cpu, cuda (each rank on cuda:LOCAL_RANK) or cuda:N (one device, shared under Gloo)";
  if (*text == "cpu") return device_request{};
  if (*text == "cuda") return device_request{.cuda = true};
  const std::string_view index = std::string_view(*text).substr(std::min<std::size_t>(5, text->size()));
  int value = 0;
  const auto [end, error] = std::from_chars(index.data(), index.data() + index.size(), value);
  if (!text->starts_with("cuda:") || index.empty() || error != std::errc{} || end != index.data() + index.size() ||
      value < 0) {
    reject("LOOM_DEVICE", *text, expected);
  }
  return device_request{.cuda = true, .index = value};
}

bool parse_flag(const reader& env, const char* name) {
  auto text = env.get(name);
  if (!text || text->empty() || *text == "0" || *text == "False" || *text == "false") return false;
  if (*text == "1" || *text == "True" || *text == "true") return true;
  reject(name, *text, "True or False (as torchrun sets it)");
}

}  // namespace

std::string_view to_string(backend_kind kind) noexcept { return kind == backend_kind::gloo ? "gloo" : "nccl"; }

std::optional<std::string> process_env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::optional<std::string>(value) : std::nullopt;
}

launch_env parse_launch_env(const env_lookup& lookup) {
  reader env(lookup);
  launch_env result;
  result.timeout = parse_seconds(env, "LOOM_TIMEOUT_S", launch_env::default_timeout,
                                 "a positive number of seconds, e.g. LOOM_TIMEOUT_S=60 or 0.5", false);
  result.hang_check = parse_seconds(env, "LOOM_HANG_CHECK_S", launch_env::default_hang_check,
                                    "a number of seconds, e.g. LOOM_HANG_CHECK_S=10, or 0 to turn the check off", true);
  result.backend = parse_backend(env);
  result.device = parse_device(env);
  result.error_file = env.get("LOOM_ERROR_FILE").value_or("");
  if (auto shown = env.get("TORCH_SHOW_CPP_STACKTRACES"); shown && !shown->empty()) {
    if (*shown != "0" && *shown != "1") reject("TORCH_SHOW_CPP_STACKTRACES", *shown, "0 or 1, as PyTorch reads it");
    result.show_cpp_stack_traces = *shown == "1";
  }

  bool launched = false;
  for (const char* name : launcher_variables) launched = launched || env.get(name).has_value();
  if (!launched) return result;  // a plain single process: no rendezvous

  constexpr auto why = "another launcher variable is";
  constexpr long long max_world = 1 << 20;
  result.world_size = env.integer("WORLD_SIZE", 1, max_world, "a positive integer: the number of processes in the job",
                                  std::nullopt, why);
  result.rank =
      env.integer("RANK", 0, max_world, "a non-negative integer: this process's global rank", std::nullopt, why);
  if (result.rank >= result.world_size) {
    throw_error<launch_error>("RANK={} is not below WORLD_SIZE={}: ranks are numbered 0 to WORLD_SIZE-1", result.rank,
                              result.world_size);
  }
  result.local_world_size = env.integer("LOCAL_WORLD_SIZE", 1, result.world_size,
                                        "a positive integer no larger than WORLD_SIZE", result.world_size, why);
  result.local_rank =
      env.integer("LOCAL_RANK", 0, result.local_world_size - 1, "a non-negative integer below LOCAL_WORLD_SIZE",
                  result.rank % result.local_world_size, why);
  // One process needs no rendezvous: WORLD_SIZE=1 without MASTER_ADDR is a plain single process.
  if (result.world_size == 1 && !env.get("MASTER_ADDR")) return result;
  result.master_addr = env.require("MASTER_ADDR", "the rendezvous needs the master's host");
  result.master_port =
      static_cast<std::uint16_t>(env.integer("MASTER_PORT", 1, 65535, "a TCP port, an integer from 1 to 65535",
                                             std::nullopt, "the rendezvous needs the master's port"));
  result.agent_store = parse_flag(env, "TORCHELASTIC_USE_AGENT_STORE");
  result.restart_count = env.integer("TORCHELASTIC_RESTART_COUNT", 0, 1 << 30, "a non-negative integer", 0, why);
  return result;
}

std::vector<environment_setting> nccl_environment(const launch_env& env, const env_lookup& lookup) {
  const auto timeout_s = std::chrono::ceil<std::chrono::seconds>(env.timeout).count();
  const std::vector<environment_setting> wanted{
      // 3 (SkipCleanUp): a failed or timed-out collective ends the process without waiting on NCCL.
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}, {"TORCH_NCCL_BLOCKING_WAIT", "0"},
      {"TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"}, {"TORCH_NCCL_DUMP_ON_TIMEOUT", "1"},
      {"TORCH_NCCL_ENABLE_MONITORING", "1"},    {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", std::to_string(timeout_s + 60)},
  };
  std::vector<environment_setting> settings;
  for (const environment_setting& setting : wanted) {
    if (!lookup(setting.name.c_str())) settings.push_back(setting);
  }
  return settings;
}

}  // namespace loom
