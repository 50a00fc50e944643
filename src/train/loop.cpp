#include <loom/train/loop.hpp>

#include "run_folder_lock.hpp"

#include <loom/base/text.hpp>
#include <loom/io/files.hpp>
#include <loom/io/optimizer_state.hpp>
#include <loom/runtime/collectives.hpp>
#include <loom/runtime/failures.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/runtime/peak_memory.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
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

// What was not finite in a step: its loss, and on which rank (the lowest), or its gradient norm.
std::string nonfinite_finding(std::int64_t step, double loss, double grad_norm, double bad_rank) {
  if (bad_rank >= 0) {
    return fmt::format("the loss of step {} is {} (averaged over the ranks), not finite on rank {}", step, loss,
                       static_cast<int>(bad_rank));
  }
  if (!std::isfinite(loss)) return fmt::format("the loss of step {} is {} (averaged over the ranks)", step, loss);
  return fmt::format("the gradient norm of step {} is {}, with every rank's loss finite", step, grad_norm);
}

}  // namespace

std::string_view to_string(nonfinite_policy policy) noexcept {
  switch (policy) {
    case nonfinite_policy::stop: return "stop";
    case nonfinite_policy::skip: return "skip";
  }
  return "stop";
}

std::optional<nonfinite_policy> nonfinite_policy_named(std::string_view name) noexcept {
  for (const nonfinite_policy policy : {nonfinite_policy::stop, nonfinite_policy::skip}) {
    if (to_string(policy) == name) return policy;
  }
  return std::nullopt;
}

void check_train_functions(const train_functions& functions) {
  if (!functions.loss) {
    throw_error<std::invalid_argument>(
        "train: train_functions.loss is empty; give the function that returns a micro-batch's mean loss");
  }
  if (static_cast<bool>(functions.data_state) != static_cast<bool>(functions.restore_data)) {
    const bool saves = static_cast<bool>(functions.data_state);
    throw_error<std::invalid_argument>(
        "train: train_functions.{} is set and {} is not; give both (the data's position is saved with each "
        "checkpoint and put back on resume) or neither",
        saves ? "data_state" : "restore_data", saves ? "restore_data" : "data_state");
  }
}

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
  if (options.max_skipped_steps < 0) {
    return option_problem{"max_skipped_steps", fmt::format("is {}; give 0 or more", options.max_skipped_steps)};
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
  reset_peak_memory(rt_.device());
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
    // Before anything in the folder is touched: a second job would remove this one's partial checkpoints.
    lock_ = std::make_unique<run_folder_lock>(
        options_.out, rt_.env().is_launched() ? fmt::format("rank 0 of {} at {}:{}", counted(rt_.world_size(), "rank"),
                                                            rt_.env().master_addr, rt_.env().master_port)
                                              : std::string());
    atomic_file probe(options_.out / ".loom-writable");
    probe.write("ok", 2);
    probe.commit();
    std::filesystem::remove(options_.out / ".loom-writable");
  });
  checkpoints_ =
      std::make_unique<checkpointer>(rt_, checkpoint_options{.folder = options_.out / "checkpoints",
                                                             .keep = options_.keep_checkpoints,
                                                             .strict = options_.strict_checkpoints,
                                                             .async_save = options_.async_checkpoints,
                                                             .data = options_.data_identity,
                                                             .resume_over_changes = options_.resume_over_changes});
}

void train_session::resume_from(const resume_point& resumed, const train_functions& functions, int tensor_parallel) {
  // Every rank resumed the same checkpoint, so every rank refuses alike.
  if (resumed.step > options_.steps) {
    throw_error<std::invalid_argument>(
        "train: the checkpoint '{}' is at step {}, past this run's {} steps, so there is nothing to train: give more "
        "steps than {} to go on from it, or another out folder (or remove '{}') to train {} steps afresh",
        resumed.path.string(), resumed.step, options_.steps, resumed.step, resumed.path.parent_path().string(),
        options_.steps);
  }
  // The JSON this session saved (checkpoint_state), or a checkpointer's user's own.
  const json saved = json::parse(resumed.user_state, nullptr, /*allow_exceptions=*/false);
  if (saved.is_object() && saved.contains("skipped_steps") && saved["skipped_steps"].is_number_integer()) {
    skipped_steps_ = saved["skipped_steps"].get<std::int64_t>();
  }
  if (functions.restore_data) {
    run_on_every_rank(rt_, "restoring the data's position", [&] {
      if (resumed.world_size != rt_.world_size() || resumed.tensor_parallel != tensor_parallel) {
        const auto in_groups = [](int k) { return k == 1 ? std::string() : fmt::format(" in tensor_parallel({})", k); };
        throw_error<std::invalid_argument>(
            "train: the checkpoint '{}' holds the data's position of each of its {}{} and this run has {}{}: a "
            "rank's position cannot be split or joined, so resume with {}{}, or start afresh in another out folder",
            resumed.path.string(), counted(resumed.world_size, "rank"), in_groups(resumed.tensor_parallel),
            rt_.world_size(), in_groups(tensor_parallel), counted(resumed.world_size, "rank"),
            in_groups(resumed.tensor_parallel));
      }
      if (resumed.rank_state.empty()) {
        throw_error<std::invalid_argument>(
            "train: the checkpoint '{}' holds no data position for rank {} (the run that saved it gave loom::train "
            "no data_state), so this run cannot read on from where that one stopped: resume it without data_state, "
            "or start afresh in another out folder",
            resumed.path.string(), rt_.rank());
      }
      try {
        functions.restore_data(resumed.rank_state);
      } catch (const std::exception& error) {
        throw_error<std::invalid_argument>(
            "train: the data's position that '{}' saved for rank {} does not fit this run's data: {}",
            resumed.path.string(), rt_.rank(), error_text(error));
      }
    });
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

std::string train_session::checkpoint_state(std::int64_t step) const {
  return json{{"step", step}, {"skipped_steps", skipped_steps_}}.dump();
}

void train_session::begin_step(std::int64_t step, torch::optim::Optimizer& optimizer) {
  step_started_ = steady::now();
  if (steps_this_run_ == 0) first_logged_step_ = step;
  if (options_.lr) {
    // A skipped step took no step of the schedule either.
    lr_ = options_.lr->at(step - skipped_steps_);
    apply_learning_rate(optimizer, lr_);
  } else {
    lr_ = optimizer.param_groups().front().options().get_lr();
  }
}

// The slots of tracked_: the step's record (step_mean to step_bad_rank) and the first bad step's
// (first_bad_step to first_bad_rank) each in the same order, so that each is written by one copy.
enum tracked_slot : std::int64_t {
  loss_since_log,
  rank_mean,
  step_mean,
  norm,
  step_bad,
  step_bad_rank,
  first_bad_step,
  first_bad_loss,
  first_bad_norm,
  first_bad_rank,
  stop_asked,  // how many ranks were asked to stop (a signal)
  slots
};
constexpr std::int64_t record_size = 4;

// Issued before the last backward so that it is under way while the backward computes, not a
// round trip of its own after it; a signal that arrives after this point stops the next step.
void train_session::share_loss(const at::Tensor& loss_sum) {
  const at::Tensor mean = (loss_sum.to(at::kDouble) / options_.accumulate).reshape({});
  if (!tracked_.defined()) tracked_ = at::zeros({slots}, mean.options());
  tracked_[rank_mean].copy_(mean);
  // One all-reduce carries the loss, which ranks' losses are not finite (the sum of a NaN is NaN, and
  // of flags, flags) and whether any rank was asked to stop: on a GPU, where it runs on the device, no
  // host collective joins it. One tensor for the run: the last step's reduction has been waited for.
  const std::int64_t world = rt_.world_size();
  if (!shared_loss_.defined()) shared_loss_ = at::empty({2 + world}, mean.options());
  shared_loss_.zero_();
  shared_loss_[0].copy_(mean);
  shared_loss_[1 + rt_.rank()].copy_(mean.isfinite().logical_not());
  shared_loss_[1 + world].fill_(stop_signal.load() != 0 ? 1 : 0);
  loss_reduction_ = rt_.comm().all_reduce(shared_loss_, reduce_op::sum);
}

bool train_session::end_step(std::int64_t step, const at::Tensor& grad_norm, bool report) {
  loss_reduction_.wait();  // under NCCL the device waits, not the host
  // The step's record, kept on the device; every rank's is the same.
  const std::int64_t world = rt_.world_size();
  const at::Tensor mean = shared_loss_[0] / world;
  const at::Tensor bad_ranks = shared_loss_.narrow(0, 1, world) > 0;
  const at::Tensor any_bad_rank = bad_ranks.any();
  const at::Tensor step_norm = grad_norm.defined() ? grad_norm.to(at::kDouble).reshape({}) : at::zeros_like(mean);
  const at::Tensor bad =
      mean.isfinite().logical_not().logical_or(any_bad_rank).logical_or(step_norm.isfinite().logical_not());
  const at::Tensor bad_rank = at::where(any_bad_rank, bad_ranks.to(at::kDouble).argmax().to(at::kDouble), -1.0);
  tracked_.narrow(0, step_mean, record_size).copy_(at::stack({mean, step_norm, bad.to(at::kDouble), bad_rank}));
  tracked_[loss_since_log].add_(at::where(bad, 0.0, mean));
  tracked_[stop_asked].copy_(shared_loss_[1 + world]);
  const at::Tensor first = tracked_.narrow(0, first_bad_step, record_size);
  const at::Tensor this_step = at::full({}, static_cast<double>(step), mean.options());
  first.copy_(at::where(bad.logical_and(first[0] == 0), at::stack({this_step, mean, step_norm, bad_rank}), first));
  ++steps_since_log_;
  ++steps_this_run_;
  step_ms_ = seconds_between(step_started_, steady::now()) * 1e3;
  const bool skipping = options_.on_nonfinite == nonfinite_policy::skip;
  const bool by_steps = step % options_.log_every == 0 || step == options_.steps || step == first_logged_step_;
  const bool every_rank_reads = by_steps || report || skipping || checkpoint_due(step);
  bool skipped = false;
  if (every_rank_reads) skipped = read_losses(step, grad_norm.defined());
  // Every rank learns of a stop at the same step: on the CPU at every step (the all-reduce's result is
  // host memory); on a GPU at the steps whose record every rank reads, and no other read is added.
  if (rt_.device().is_cpu()) {
    preempted_ = shared_loss_.const_data_ptr<double>()[1 + world] > 0;
  } else if (every_rank_reads) {
    preempted_ = stop_asked_ > 0;
  }
  const bool by_time = seconds_between(last_progress_, steady::now()) >= options_.log_seconds;
  const bool logged = by_steps || by_time || preempted_;
  if (logged && !every_rank_reads) skipped = read_losses(step, grad_norm.defined());
  if (logged && !skipped) log(step);  // a skipped step has its own line
  return !skipped;
}

bool train_session::read_losses(std::int64_t step, bool with_norm) {
  const at::Tensor host = read_on_host(rt_.progress(), tracked_);
  const auto* values = host.const_data_ptr<double>();
  bool skipped = false;
  if (options_.on_nonfinite == nonfinite_policy::skip && values[step_bad] != 0) {
    if (skipped_steps_ == options_.max_skipped_steps) {
      stop_nonfinite(step, values[step_mean], values[norm], values[step_bad_rank], step);
    }
    ++skipped_steps_;
    --steps_since_log_;  // its loss is not in the mean that is logged
    skipped = true;
    const double rank = values[step_bad_rank];
    if (rt_.rank() == 0) {
      json line{{"step", step}, {"skipped", true}, {"skipped_steps", skipped_steps_}};
      if (std::isfinite(values[step_mean])) line["loss"] = values[step_mean];
      if (rank >= 0) line["rank"] = static_cast<int>(rank);
      if (with_norm) line["grad_norm"] = std::isfinite(values[norm]) ? json(values[norm]) : json(nullptr);
      write_metrics(line.dump());
      fmt::print(stderr, "{}: {}; every rank skips the step ({} of at most {} in the run)\n", error_message("train"),
                 nonfinite_finding(step, values[step_mean], values[norm], rank), skipped_steps_,
                 options_.max_skipped_steps);
      std::fflush(stderr);
    }
  } else if (options_.on_nonfinite == nonfinite_policy::stop && values[first_bad_step] != 0) {
    stop_nonfinite(static_cast<std::int64_t>(values[first_bad_step]), values[first_bad_loss], values[first_bad_norm],
                   values[first_bad_rank], step);
  }
  loss_since_log_ = values[loss_since_log];
  step_loss_ = values[step_mean];
  rank_loss_ = values[rank_mean];
  stop_asked_ = values[stop_asked];
  grad_norm_ = with_norm ? std::optional(values[norm]) : std::nullopt;
  return skipped;
}

void train_session::stop_nonfinite(std::int64_t bad_step, double loss, double grad_norm, double bad_rank,
                                   std::int64_t at_step) const {
  const std::string kept = options_.out.empty() ? std::string("no checkpoint is kept (train_options.out is empty)")
                                                : fmt::format("the newest checkpoint in '{}' is the last good state",
                                                              (options_.out / "checkpoints").string());
  const std::string why =
      options_.on_nonfinite == nonfinite_policy::skip
          ? fmt::format("it would be skip {} of a run that allows {} (train_options.max_skipped_steps)",
                        skipped_steps_ + 1, options_.max_skipped_steps)
          : std::string("train_options.on_nonfinite is \"stop\" (\"skip\" skips such steps)");
  throw_error<std::runtime_error>("train: {}; {}, so the run stops before the update of step {}, and {}",
                                  nonfinite_finding(bad_step, loss, grad_norm, bad_rank), why, at_step, kept);
}

void train_session::record_eval(std::int64_t step, const at::Tensor& loss) {
  at::Tensor mean = loss.detach().to(at::kDouble).reshape({1}).to(rt_.device());
  rt_.comm().all_reduce(mean, reduce_op::mean).wait();
  eval_loss_ = host_value<double>(read_on_host(rt_.progress(), mean));
  last_eval_ = eval_point{step, *eval_loss_};
  if (!best_eval_ || *eval_loss_ < best_eval_->loss) best_eval_ = last_eval_;
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

void train_session::summarize(train_result& result) const {
  result.seconds = seconds_between(started_, steady::now());
  result.best_eval = best_eval_;
  result.last_eval = last_eval_;
  // Each rank's peak in its own slot of a sum: one small all-reduce gathers them all.
  at::Tensor peaks = at::zeros({rt_.world_size()}, at::kLong);
  peaks[rt_.rank()] = peak_memory_bytes(rt_.device());
  peaks = peaks.to(rt_.device());
  try {
    rt_.comm().all_reduce(peaks, reduce_op::sum).wait();
  } catch (...) {
    // A peer that failed while this rank waited here (its hang check found a rank that left the
    // steps early) breaks the transport: its published reason, not Gloo's, is this rank's error.
    rethrow_as_job_failure(rt_, std::current_exception(), "end-of-run summary");
  }
  const at::Tensor read = read_on_host(rt_.progress(), peaks);
  result.peak_memory_bytes.assign(read.data_ptr<std::int64_t>(), read.data_ptr<std::int64_t>() + read.numel());
  if (rt_.rank() != 0) return;

  const bool finished = result.outcome == train_outcome::finished;
  std::string line =
      fmt::format("{}{}{} {} in {:.1f} s", options_.name, options_.name.empty() ? "" : ": ",
                  finished ? "finished" : "stopped to be resumed after",
                  result.first_step > result.last_step
                      ? fmt::format("with no step to take (step {} was the last)", result.last_step)
                      : fmt::format("steps {} … {} of {}", result.first_step, result.last_step, options_.steps),
                  result.seconds);
  if (best_eval_) {
    line += fmt::format("; eval loss best {:.3f} at step {}, last {:.3f} at step {}", best_eval_->loss,
                        best_eval_->step, last_eval_->loss, last_eval_->step);
  }
  std::vector<std::string> peaks_mib;
  for (const std::int64_t bytes : result.peak_memory_bytes)
    peaks_mib.push_back(fmt::format("{:.0f}", megabytes(bytes)));
  line +=
      fmt::format("; peak memory per rank ({}), MiB: [{}]", peak_memory_kind(rt_.device()), fmt::join(peaks_mib, ", "));
  if (!options_.out.empty()) {
    line +=
        fmt::format("; checkpoints in {}, metrics in {}, this summary in {}", (options_.out / "checkpoints").string(),
                    (options_.out / "metrics.jsonl").string(), (options_.out / "summary.json").string());
  }
  fmt::print("{}\n", line);
  std::fflush(stdout);
  json summary{{"finished", finished},
               {"first_step", result.first_step},
               {"last_step", result.last_step},
               {"seconds", result.seconds},
               {"peak_memory_bytes", result.peak_memory_bytes}};
  if (best_eval_) {
    summary["best_eval"] = {{"step", best_eval_->step}, {"loss", best_eval_->loss}};
    summary["last_eval"] = {{"step", last_eval_->step}, {"loss", last_eval_->loss}};
  }
  if (!options_.out.empty()) {
    // Whole or not at all: a recipe started again reads it to say what the folder holds.
    const std::string text = summary.dump(2) + '\n';
    atomic_file file(options_.out / "summary.json");
    file.write(text.data(), text.size());
    file.commit();
  }
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
