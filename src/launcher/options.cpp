#include "options.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>
#include <string>

namespace loom::launcher {
namespace {

constexpr int max_ranks_per_node = 1024;  // each rank holds two pipes and a process
constexpr int max_nodes = 65536;          // keeps the world size far from int overflow
constexpr int torchrun_default_port = 29500;
constexpr std::string_view single_node_address = "127.0.0.1";
constexpr double max_grace_seconds = 86400;  // a day; also keeps the deadline arithmetic finite
constexpr int most_restarts = 1000000;       // keeps the count far from int overflow

std::string text(std::string_view s) { return std::string{s}; }

[[noreturn]] void reject(std::string_view flag, std::string_view form, std::string_view value) {
  throw usage_error{"loom-run: " + text(flag) + " expects " + text(form) + ", got '" + text(value) + "'"};
}

int parse_int(std::string_view flag, std::string_view form, std::string_view value, int min, int max) {
  int parsed = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  if (error != std::errc{} || end != value.data() + value.size() || parsed < min || parsed > max)
    reject(flag, form, value);
  return parsed;
}

double parse_seconds(std::string_view flag, std::string_view form, std::string_view value) {
  double parsed = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  const bool in_range = parsed >= 0 && parsed <= max_grace_seconds;  // false for NaN too
  if (error != std::errc{} || end != value.data() + value.size() || !in_range) reject(flag, form, value);
  return parsed;
}

// A flag that takes a value, as `--flag VALUE` or `--flag=VALUE`, in both of torchrun's spellings.
struct value_flag {
  std::string_view names;      // CLI11's "--nproc-per-node,--nproc_per_node"
  std::string_view type_name;  // the value's name in CLI11's messages
  std::string_view form;       // what the value must look like, for our messages
  void (*apply)(launch_options&, std::string_view flag, std::string_view form, std::string_view value);
};

constexpr std::array value_flags{
    value_flag{"--nproc-per-node,--nproc_per_node", "N", "a positive integer N (ranks on this node, at most 1024)",
               [](launch_options& o, auto flag, auto form, auto value) {
                 o.nproc_per_node = parse_int(flag, form, value, 1, max_ranks_per_node);
               }},
    value_flag{"--nnodes", "M", "a positive integer M (nodes in the job; elastic MIN:MAX is not supported)",
               [](launch_options& o, auto flag, auto form, auto value) {
                 o.nnodes = parse_int(flag, form, value, 1, max_nodes);
               }},
    value_flag{"--node-rank,--node_rank", "R", "an integer R with 0 <= R < --nnodes",
               [](launch_options& o, auto flag, auto form, auto value) {
                 o.node_rank = parse_int(flag, form, value, 0, max_nodes - 1);
               }},
    value_flag{"--master-addr,--master_addr", "HOST", "a host name or IP address of node 0",
               [](launch_options& o, auto flag, auto form, auto value) {
                 if (value.empty()) reject(flag, form, value);
                 o.master_addr = text(value);
               }},
    value_flag{"--master-port,--master_port", "PORT", "a port number in 1..65535",
               [](launch_options& o, auto flag, auto form, auto value) {
                 o.master_port = parse_int(flag, form, value, 1, 65535);
               }},
    value_flag{"--max-restarts,--max_restarts", "N", "a whole number N of restarts after a failure, 0..1000000",
               [](launch_options& o, auto flag, auto form, auto value) {
                 o.max_restarts = parse_int(flag, form, value, 0, most_restarts);
               }},
    value_flag{"--grace-s,--grace_s", "SECONDS", "a number of seconds in 0..86400 (e.g. 10 or 0.5)",
               [](launch_options& o, auto flag, auto form, auto value) {
                 o.grace_seconds = parse_seconds(flag, form, value);
               }},
    // torchrun's c10d rendezvous: node 0's TCPStore, which is what loom-run's master is.
    value_flag{"--rdzv-endpoint,--rdzv_endpoint", "HOST[:PORT]", "HOST or HOST:PORT, node 0's address and port",
               [](launch_options& o, auto flag, auto form, auto value) {
                 const auto colon = value.rfind(':');
                 const std::string_view host = value.substr(0, colon);
                 if (host.empty()) reject(flag, form, value);
                 o.master_addr = text(host);
                 if (colon != std::string_view::npos) {
                   o.master_port = parse_int(flag, form, value.substr(colon + 1), 1, 65535);
                 }
               }},
    value_flag{"--rdzv-backend,--rdzv_backend", "NAME",
               "c10d or static: loom-run meets at node 0's TCPStore (etcd is not supported; give --master-addr and "
               "--master-port)",
               [](launch_options&, auto flag, auto form, auto value) {
                 if (value != "c10d" && value != "static") reject(flag, form, value);
               }},
    // Not needed: each start of the ranks gets a key space of its own in the store.
    value_flag{"--rdzv-id,--rdzv_id", "ID", "a job id", [](launch_options&, auto, auto, auto) {}},
};

// torchrun's flags that loom-run does not take, each with what to do instead.
struct hinted_flag {
  std::string_view names;
  std::string_view hint;
};

constexpr std::string_view output_hint =
    "every rank's output comes through loom-run's own, each line prefixed with its rank: keep it with "
    "'loom-run ... 2>&1 | tee run.log' (loom::train also writes metrics.jsonl in its out folder)";

constexpr std::array hinted_flags{
    hinted_flag{"--log-dir,--log_dir", output_hint},
    hinted_flag{"--tee", output_hint},
    hinted_flag{"--redirects,-r", output_hint},
    hinted_flag{"--local-ranks-filter,--local_ranks_filter",
                "every rank's lines are prefixed with its rank: keep one rank's with grep (--no-prefix drops the "
                "prefix)"},
    hinted_flag{"--module,-m", "loom-run starts an executable once per rank (a C++ program), not a Python module"},
};

// NAME's value in loom-run's environment; empty when unset.
std::string environment_value(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string{} : std::string{value};
}

// "--master-port" of "--master-port,--master_port".
std::string_view first_name(std::string_view names) { return names.substr(0, names.find(',')); }

// torchrun reads each flag it is not given from PET_<NAME> (its argparse `env` action), so
// PET_MASTER_ADDR and PET_MASTER_PORT stand for --master-addr and --master-port; it never reads
// MASTER_ADDR or MASTER_PORT, whose inherited values its workers get replaced by the rendezvous's.
// loom-run does the same, and says in a line what it took from the environment, and what it left
// there with the flag that would choose it.
void master_from_environment(launch_options& options) {
  const bool address_given = options.master_addr.has_value();
  const bool port_given = options.master_port.has_value();
  struct flag_variable {
    const char* variable;
    std::string_view flag;
    bool given;
  };
  for (const flag_variable& each : {flag_variable{"PET_MASTER_ADDR", "--master-addr", address_given},
                                    flag_variable{"PET_MASTER_PORT", "--master-port", port_given}}) {
    const std::string value = environment_value(each.variable);
    if (each.given || value.empty()) continue;  // the flag wins, as under torchrun
    const value_flag& flag = *std::ranges::find_if(
        value_flags, [&](const value_flag& known) { return first_name(known.names) == each.flag; });
    flag.apply(options, each.variable, flag.form, value);
    options.notes.push_back(text(each.variable) + "=" + value + " in the environment stands for " + text(each.flag) +
                            " " + value + ", as under torchrun");
  }
  if (const std::string address = environment_value("MASTER_ADDR");
      !address.empty() && !options.master_addr && address != single_node_address) {
    options.notes.push_back("MASTER_ADDR=" + address +
                            " in the environment is not used, as under torchrun: the ranks meet at " +
                            text(single_node_address) + "; give --master-addr " + address + " to meet there");
  }
  const std::string port = environment_value("MASTER_PORT");
  const bool several_nodes = options.nnodes > 1;
  if (!port.empty() && !options.master_port && !(several_nodes && port == std::to_string(torchrun_default_port))) {
    options.notes.push_back(
        "MASTER_PORT=" + port + " in the environment is not used, as under torchrun: the ranks meet " +
        (several_nodes ? "at port 29500, torchrun's default for several nodes" : "at a free port that loom-run picks") +
        "; give --master-port " + port + " to meet there");
  }
}

void check_consistency(const launch_options& options, bool standalone) {
  if (options.program.empty())
    throw usage_error{"loom-run: no program given; usage: loom-run [flags] [--] PROGRAM [ARGS...]"};
  if (const std::string& program = options.program.front(); program.ends_with(".py")) {
    throw usage_error{"loom-run: '" + program +
                      "' is a Python script; loom-run starts an executable once per rank (a C++ program built "
                      "against loom, e.g. build/dsl_examples/tiny-gpt): build it and give its path (for a Python "
                      "script, use torchrun)"};
  }
  if (options.node_rank >= options.nnodes)
    throw usage_error{"loom-run: --node-rank expects an integer R with 0 <= R < --nnodes (" +
                      std::to_string(options.nnodes) + "), got '" + std::to_string(options.node_rank) + "'"};
  if (standalone && options.nnodes > 1)
    throw usage_error{"loom-run: --standalone runs a single node; drop it or use --nnodes 1"};
  if (options.nnodes > 1 && !options.master_addr) {
    const std::string inherited = environment_value("MASTER_ADDR");
    throw usage_error{"loom-run: --nnodes " + std::to_string(options.nnodes) +
                      " expects --master-addr HOST (node 0's address, reachable from every node)" +
                      (inherited.empty() ? ""
                                         : "; MASTER_ADDR=" + inherited +
                                               " in the environment is not read, as under torchrun: give "
                                               "--master-addr " +
                                               inherited)};
  }
}

// The allocator the flags choose; each chooses one, so two of them are refused, as run_cpu refuses
// tcmalloc and jemalloc together.
heap_allocator chosen_allocator(bool default_allocator, bool tcmalloc, bool jemalloc) {
  const std::array<std::pair<bool, std::string_view>, 3> chosen{{{default_allocator, "--use-default-allocator"},
                                                                 {tcmalloc, "--enable-tcmalloc"},
                                                                 {jemalloc, "--enable-jemalloc"}}};
  std::vector<std::string_view> given;
  for (const auto& [set, name] : chosen)
    if (set) given.push_back(name);
  if (given.size() > 1)
    throw usage_error{"loom-run: " + text(given[0]) + " and " + text(given[1]) +
                      " each choose the ranks' allocator: give one of them"};
  if (tcmalloc) return heap_allocator::tcmalloc;
  if (jemalloc) return heap_allocator::jemalloc;
  return default_allocator ? heap_allocator::glibc : heap_allocator::tuned_glibc;
}

}  // namespace

// CLI11 splits the words (both spellings, `--flag=VALUE`, `--`, the program and its arguments as a
// prefix command); each value is checked by its flag's own rule, whose sentence is the error.
std::variant<launch_options, help_requested, version_requested> parse_command_line(
    std::span<const std::string_view> args) {
  launch_options options;
  bool standalone = false;
  bool help = false;
  bool no_prefix = false;
  bool default_allocator = false;
  bool tcmalloc = false;
  bool jemalloc = false;
  bool version = false;

  CLI::App app{"", "loom-run"};
  app.set_help_flag();  // usage_text() is the help; CLI11's own would repeat it less well
  app.prefix_command();
  app.add_flag("-h,--help", help)->disable_flag_override();
  app.add_flag("--version", version)->disable_flag_override();
  // torchrun's, and what loom-run always does: it starts the program itself.
  app.add_flag("--no-python,--no_python")->disable_flag_override();
  app.add_flag("--no-prefix,--no_prefix", no_prefix)->disable_flag_override();
  app.add_flag("--all-output,--all_output", options.all_output)->disable_flag_override();
  app.add_flag("--standalone", standalone)->disable_flag_override();
  app.add_flag("--use-default-allocator,--use_default_allocator", default_allocator)->disable_flag_override();
  app.add_flag("--enable-tcmalloc,--enable_tcmalloc", tcmalloc)->disable_flag_override();
  app.add_flag("--enable-jemalloc,--enable_jemalloc", jemalloc)->disable_flag_override();
  for (const value_flag& flag : value_flags) {
    app.add_option_function<std::string>(std::string{flag.names},
                                         [&options, &flag](const std::string& value) {
                                           const std::string_view names = flag.names;
                                           flag.apply(options, names.substr(0, names.find(',')), flag.form, value);
                                         })
        ->type_name(std::string{flag.type_name});
  }
  for (const hinted_flag& flag : hinted_flags) {
    app.add_option_function<std::string>(std::string{flag.names}, [&flag](const std::string&) {
      const std::string_view names = flag.names;
      throw usage_error{"loom-run: " + text(names.substr(0, names.find(','))) +
                        " is torchrun's, not loom-run's: " + text(flag.hint)};
    });
  }

  // CLI11 wants the words last first, as argv would give them after the program's name.
  std::vector<std::string> words(args.rbegin(), args.rend());
  try {
    app.parse(words);
  } catch (const CLI::ParseError& error) {
    throw usage_error{"loom-run: " + std::string{error.what()}};
  }
  if (help) return help_requested{};
  if (version) return version_requested{};

  // CLI11 stops at the first word it does not take: the program, the `--` before it, or a flag it
  // does not know, whatever follows (a `--` further on included).
  std::vector<std::string> program = app.remaining();
  const bool after_separator = !program.empty() && program.front() == "--";
  if (after_separator) {
    program.erase(program.begin());
  } else if (!program.empty() && program.front().starts_with('-') && program.front() != "-") {
    const std::string& written = program.front();
    throw usage_error{
        "loom-run: unknown flag '" + written.substr(0, written.find('=')) +
        "'; accepted: --nproc-per-node N, --nnodes M, --node-rank R, --master-addr A, "
        "--master-port P, --rdzv-endpoint A:P, --rdzv-backend c10d, --rdzv-id ID, --max-restarts N, --grace-s S, "
        "--no-prefix, --all-output, --use-default-allocator, --enable-tcmalloc, --enable-jemalloc, --standalone, "
        "--no-python, --help, --version"};
  }
  options.prefix_output = !no_prefix;
  options.allocator = chosen_allocator(default_allocator, tcmalloc, jemalloc);
  options.program = std::move(program);
  master_from_environment(options);
  check_consistency(options, standalone);
  if (options.nnodes > 1 && !options.master_port) options.master_port = torchrun_default_port;
  return options;
}

std::string_view usage_text() {
  return R"(usage: loom-run [flags] [--] PROGRAM [ARGS...]

Starts PROGRAM once per local rank with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, ...), prefixes each output line with
"[rank k] ", and stops every rank when one fails.

flags (torchrun's; '_' and '-' are interchangeable, '--flag=VALUE' works too):
  --nproc-per-node N   ranks on this node (default 1)
  --nnodes M           nodes in the job (default 1)
  --node-rank R        this node's index, 0 <= R < M (default 0)
  --master-addr A      node 0's address (default 127.0.0.1; required when M > 1)
  --master-port P      rendezvous port (default: a free port on one node, 29500 on several)
  --rdzv-endpoint A[:P]  torchrun's c10d rendezvous: the same as --master-addr A --master-port P
  --rdzv-backend c10d  accepted (static too): loom-run meets at node 0's TCPStore; etcd is not supported
  --rdzv-id ID         accepted and not needed: each start of the ranks has a key space of its own
  --standalone         accepted for torchrun compatibility: a single node (the default)
  --no-python          accepted: loom-run always starts PROGRAM itself, an executable
  --max-restarts N     when a rank fails, stop every rank and start them all again, at most N times
                       (default 0), each time with TORCHELASTIC_RESTART_COUNT one higher and a fresh
                       rendezvous; a rank that exits 75 (stopped to be resumed) is not a failure
  --no-prefix          do not prefix output lines with "[rank k] "
  --all-output         also relay c10d's warnings that ranks print while being stopped (their broken
                       connections to the failed rank); by default they are left out and counted
  --grace-s S          seconds between SIGTERM and SIGKILL when stopping ranks (default 10)
  --use-default-allocator
                       leave glibc's malloc as it is; by default each rank's GLIBC_TUNABLES gains
                       glibc.malloc.mmap_threshold=33554432 and glibc.malloc.trim_threshold=1073741824
                       (where not set already), so that a step reuses the last step's heap
  --enable-tcmalloc    preload tcmalloc (libtcmalloc_minimal.so.4, from LD_LIBRARY_PATH or the system's
                       library folders) into each rank, as torch.backends.xeon.run_cpu does
  --enable-jemalloc    preload jemalloc (libjemalloc.so.2) likewise, with run_cpu's MALLOC_CONF
  -h, --help           this text
  --version            loom-run's version

not taken, with what to do instead: --log-dir, --tee, --redirects (redirect loom-run's output),
--local-ranks-filter (grep one rank's prefixed lines), -m/--module (loom-run starts executables).

exit status: 0 when every rank exits 0; 1 when a rank fails and no restart is left (the last line
names the first one to fail in the last attempt);
2 for a bad command line; 128+N when loom-run itself is stopped by signal N (forwarded to every rank).
)";
}

}  // namespace loom::launcher
