#include <loom/train/loop.hpp>

#include <loom/base/text.hpp>
#include <loom/io/files.hpp>
#include <loom/io/optimizer_state.hpp>
#include <loom/runtime/collectives.hpp>
#include <loom/runtime/failures.hpp>
#include <loom/runtime/host_reads.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace loom {
namespace {

using json = nlohmann::json;
using steady = std::chrono::steady_clock;

// Set by SIGTERM or SIGUSR1 (what a cluster's scheduler sends before it kills a job) or SIGINT
// (Ctrl-C, which loom-run forwards to every rank).
std::atomic<int> stop_signal{0};

extern "C" void note_stop_signal(int signal_number) {
  // A second Ctrl-C does not wait for the checkpoint: the default action, now.
  if (signal_number == SIGINT && stop_signal.load() == SIGINT) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
  stop_signal.store(signal_number);
}

double seconds_between(steady::time_point from, steady::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

double megabytes(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

// The handlers the session installs, and the ones it replaced.
struct train_session::signal_handlers {
  struct sigaction previous_term {};
  struct sigaction previous_usr1 {};
  struct sigaction previous_int {};

  signal_handlers() {
    stop_signal.store(0);
    struct sigaction action {};
    action.sa_handler = note_stop_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, &previous_term);
    sigaction(SIGUSR1, &action, &previous_usr1);
    sigaction(SIGINT, &action, &previous_int);
  }
  ~signal_handlers() {
    sigaction(SIGTERM, &previous_term, nullptr);
    sigaction(SIGUSR1, &previous_usr1, nullptr);
    sigaction(SIGINT, &previous_int, nullptr);
  }
};

std::optional<option_problem> train_options_problem(const train_options& options) {
  const auto at_least_one = [](std::string_view option, std::int64_t value, std::string_view unit) {
    return value < 1 ? std::optional<option_problem>(
                           option_problem{std::string(option), fmt::format("is {}; give at least 1{}", value, unit)})
                     : std::nullopt;
  };
  if (auto found = at_least_one("steps", options.steps, "")) return found;
  if (auto found = at_least_one("accumulate", options.accumulate, " micro-batch a step")) return found;
  if (options.clip_norm && !(*options.clip_norm > 0)) {
    return option_problem{"clip_norm", fmt::format("is {}; give a positive norm, or none", *options.clip_norm)};
  }
  if (auto found = at_least_one("log_every", options.log_every, "")) return found;
  if (options.checkpoint_every < 0) {
    return option_problem{"checkpoint_every",
                          fmt::format("is {}; give 0 (at the end only) or more", options.checkpoint_every)};
  }
  if (options.eval_every < 0) {
    return option_problem{"eval_every", fmt::format("is {}; give 0 (no evaluation) or more", options.eval_every)};
  }
  if (options.keep_checkpoints < 1) {
    return option_problem{"keep_checkpoints", fmt::format("is {}; give at least 1", options.keep_checkpoints)};
  }
  if (!(options.log_seconds >= 0)) {
    return option_problem{"log_seconds", fmt::format("is {}; give 0 or more seconds", options.log_seconds)};
  }
  if (options.lr) {
    if (auto found = options.lr->problem()) return option_problem{"lr." + found->option, found->problem};
    if (options.lr->total_steps != options.steps) {
      return option_problem{"lr.total_steps", fmt::format("({}) differs from train_options.steps ({})",
                                                          options.lr->total_steps, options.steps)};
    }
  }
  return std::nullopt;
}

train_session::train_session(const runtime& rt, const train_options& options) : rt_(rt), options_(options) {
  if (const auto found = train_options_problem(options_)) {
    throw_error<std::invalid_argument>("train: train_options.{} {}", found->option, found->problem);
  }
  if (!options_.out.empty()) prepare_run_folder();
  handlers_ = std::make_unique<signal_handlers>();
  started_ = last_progress_ = steady::now();
}

train_session::~train_session() = default;

// The run folder is written to before the first step, so that one that cannot be written fails
// now, naming it, rather than at the first checkpoint.
void train_session::prepare_run_folder() {
  run_on_rank_zero(rt_, "preparing the run folder", [&] {
    std::error_code error;
    std::filesystem::create_directories(options_.out, error);
    if (error) {
      throw_error<std::invalid_argument>("train: the output folder '{}' cannot be created: {}", options_.out.string(),
                                         error.message());
    }
    atomic_file probe(options_.out / ".loom-writable");
    probe.write("ok", 2);
    probe.commit();
    std::filesystem::remove(options_.out / ".loom-writable");
  });
  checkpoints_ = std::make_unique<checkpointer>(rt_, checkpoint_options{.folder = options_.out / "checkpoints",
                                                                        .keep = options_.keep_checkpoints,
                                                                        .strict = options_.strict_checkpoints,
                                                                        .async_save = options_.async_checkpoints});
}

void train_session::announce(const resume_point& resumed) const {
  // Every rank resumed the same checkpoint, so every rank refuses alike.
  if (resumed.step > options_.steps) {
    throw_error<std::invalid_argument>(
        "train: the checkpoint '{}' is at step {}, past this run's {} steps, so there is nothing to train: give more "
        "steps than {} to go on from it, or another out folder (or remove '{}') to train {} steps afresh",
        resumed.path.string(), resumed.step, options_.steps, resumed.step, resumed.path.parent_path().string(),
        options_.steps);
  }
  if (rt_.rank() != 0) return;
  fmt::print("{}{}resumed from {} (step {})\n", options_.name, options_.name.empty() ? "" : ": ", resumed.path.string(),
             resumed.step);
  std::fflush(stdout);
}

bool train_session::checkpoint_due(std::int64_t step) const noexcept {
  return step == options_.steps || (options_.checkpoint_every > 0 && step % options_.checkpoint_every == 0);
}

bool train_session::eval_due(std::int64_t step) const noexcept {
  return options_.eval_every > 0 && (step % options_.eval_every == 0 || step == options_.steps);
}

void train_session::begin_step(std::int64_t step, torch::optim::Optimizer& optimizer) {
  step_started_ = steady::now();
  if (steps_this_run_ == 0) first_logged_step_ = step;
  if (options_.lr) {
    lr_ = options_.lr->at(step);
    apply_learning_rate(optimizer, lr_);
  } else {
    lr_ = optimizer.param_groups().front().options().get_lr();
  }
}

// The slots of tracked_.
enum tracked_slot : std::int64_t { loss_since_log, step_mean, rank_mean, first_bad_step, first_bad_loss, norm, slots };

// Issued before the last backward so that they are under way while the backward computes, not a
// round trip of their own after it; a signal that arrives after this point stops the next step.
void train_session::share_loss(const at::Tensor& loss_sum) {
  shared_loss_ = (loss_sum.to(at::kDouble) / options_.accumulate).reshape({1});
  if (!tracked_.defined()) tracked_ = at::zeros({slots}, shared_loss_.options());
  tracked_[rank_mean].copy_(shared_loss_[0]);
  loss_reduction_ = rt_.comm().all_reduce(shared_loss_, reduce_op::sum);
  stop_ = at::full({1}, stop_signal.load() != 0 ? 1 : 0, at::kInt);
  stop_reduction_ = rt_.host_comm().all_reduce(stop_, reduce_op::sum);
}

void train_session::end_step(std::int64_t step, const at::Tensor& grad_norm, bool report) {
  stop_reduction_.wait();
  preempted_ = stop_.item<int>() > 0;
  loss_reduction_.wait();
  // The step's record, kept on the device.
  const at::Tensor mean = shared_loss_[0] / rt_.world_size();
  const at::Tensor first_bad = at::logical_and(mean.isfinite().logical_not(), tracked_[first_bad_step] == 0);
  tracked_[loss_since_log].add_(mean);
  tracked_[step_mean].copy_(mean);
  tracked_[first_bad_loss].copy_(at::where(first_bad, mean, tracked_[first_bad_loss]));
  tracked_[first_bad_step].masked_fill_(first_bad, static_cast<double>(step));
  if (grad_norm.defined()) tracked_[norm].copy_(grad_norm);
  ++steps_since_log_;
  ++steps_this_run_;
  step_ms_ = seconds_between(step_started_, steady::now()) * 1e3;
  const bool by_steps = step % options_.log_every == 0 || step == options_.steps || step == first_logged_step_;
  const bool by_time = seconds_between(last_progress_, steady::now()) >= options_.log_seconds;
  const bool logged = by_steps || by_time || preempted_;
  if (logged || report || checkpoint_due(step)) read_losses(step, grad_norm.defined());
  if (logged) log(step);
}

void train_session::read_losses(std::int64_t step, bool with_norm) {
  const at::Tensor host = read_on_host(rt_.progress(), tracked_);
  const auto* values = host.const_data_ptr<double>();
  if (values[first_bad_step] != 0) {
    throw_error<std::runtime_error>(
        "train: the loss of step {} is {} (averaged over the ranks); the run stops before the update of step {}, "
        "and the newest checkpoint in '{}' is the last good state",
        static_cast<std::int64_t>(values[first_bad_step]), values[first_bad_loss], step,
        (options_.out / "checkpoints").string());
  }
  loss_since_log_ = values[loss_since_log];
  step_loss_ = values[step_mean];
  rank_loss_ = values[rank_mean];
  grad_norm_ = with_norm ? std::optional(values[norm]) : std::nullopt;
}

void train_session::record_eval(std::int64_t step, const at::Tensor& loss) {
  at::Tensor mean = loss.detach().to(at::kDouble).reshape({1}).to(rt_.device());
  rt_.comm().all_reduce(mean, reduce_op::mean).wait();
  eval_loss_ = read_on_host(rt_.progress(), mean).item<double>();
  if (rt_.rank() != 0) return;
  fmt::print("{}{}eval at step {}/{}  loss {:.3f}\n", options_.name, options_.name.empty() ? "" : " ", step,
             options_.steps, *eval_loss_);
  std::fflush(stdout);
  write_metrics(json{{"step", step}, {"eval_loss", *eval_loss_}}.dump());
}

void train_session::fail_step(std::int64_t step) const {
  rethrow_as_job_failure(rt_, std::current_exception(), fmt::format("step {}", step));
}

void train_session::measure_memory(const torch::optim::Optimizer& optimizer) {
  std::int64_t parameters = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) parameters += static_cast<std::int64_t>(p.nbytes());
  }
  parameters_mb_ = megabytes(parameters);
  optimizer_mb_ = megabytes(optimizer_state_bytes(optimizer));
}

void train_session::write_metrics(const std::string& line) const {
  if (!options_.out.empty()) std::ofstream(options_.out / "metrics.jsonl", std::ios::app) << line << '\n';
}

void train_session::log(std::int64_t step) {
  const steady::time_point now = steady::now();
  const double elapsed = seconds_between(started_, now);
  const double per_step = elapsed / static_cast<double>(std::max<std::int64_t>(steps_this_run_, 1));
  const double mean_loss = loss_since_log_ / static_cast<double>(steps_since_log_);
  tracked_[loss_since_log].zero_();
  const double tokens_per_s =
      options_.tokens_per_micro_batch > 0 && step_ms_ > 0
          ? static_cast<double>(options_.tokens_per_micro_batch * options_.accumulate * rt_.world_size()) /
                (step_ms_ / 1e3)
          : 0.0;
  steps_since_log_ = 0;
  last_progress_ = now;
  if (rt_.rank() != 0) return;
  json line{{"step", step},
            {"loss", mean_loss},
            {"lr", lr_},
            {"step_ms", step_ms_},
            {"tokens_per_s", tokens_per_s},
            {"parameters_mb", parameters_mb_},
            {"optimizer_mb", optimizer_mb_}};
  if (grad_norm_) line["grad_norm"] = *grad_norm_;
  write_metrics(line.dump());
  fmt::print("{}{}step {:>5}/{}  loss {:.3f}  lr {:.3g}{}{}  elapsed {:.0f} s  ETA {:.0f} s\n", options_.name,
             options_.name.empty() ? "" : " ", step, options_.steps, mean_loss, lr_,
             grad_norm_ ? fmt::format("  grad norm {:.3g}", *grad_norm_) : std::string(),
             tokens_per_s > 0 ? fmt::format("  {:.0f} tokens/s", tokens_per_s) : std::string(), elapsed,
             per_step * static_cast<double>(options_.steps - step));
  std::fflush(stdout);
}

}  // namespace loom
