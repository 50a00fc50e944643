#pragma once
// loom::train: the loop a recipe would otherwise write by hand, over any job (docs/training.md).
//
//   loom::train_options options{.steps = 800, .accumulate = 2, .clip_norm = 1.0,
//                               .lr = loom::lr_schedule{.peak = 2e-3, .warmup_steps = 50, .total_steps = 800},
//                               .out = "runs/pretrain", .checkpoint_every = 100};
//   auto result = loom::train(job, optimizer, {.loss = [&](std::int64_t step, int micro) {
//     auto [x, y] = batches.at(step, micro);   // a function of the step: a resumed run draws the same
//     return job.forward(x, y);
//   }}, options);
//   if (result.outcome == loom::train_outcome::preempted) return loom::resumable_exit_code;
//
// Each optimizer step runs `accumulate` micro-batches (all but the last under job.no_sync(), each
// loss divided by their number, so the step equals one big batch), clips the global norm, sets the
// learning rate of the step, and steps. The run resumes from the newest checkpoint in out/, writes
// one, every checkpoint_every steps, at the end, and when SIGTERM, SIGUSR1 or SIGINT arrives (after the step
// under way, on every rank), stops on (or skips) a step whose loss or gradient norm is not finite,
// and logs to out/metrics.jsonl. With data_state and restore_data the data's position is each rank's
// part of the checkpoint, so that a resumed run reads the batches an uninterrupted one reads.
// The losses and the norm stay on the device, and the host reads them once on the steps it logs or
// checkpoints (and every step for on_step, or to skip), so that on a GPU it runs ahead into the next steps.

#include <loom/checkpoint/checkpoint.hpp>
#include <loom/runtime/failpoints.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/runtime/runtime.hpp>
#include <loom/train/ema.hpp>
#include <loom/train/lr_schedule.hpp>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

class run_folder_lock;  // src/train/run_folder_lock.hpp

// The exit code of a run stopped to be resumed (EX_TEMPFAIL: try again).
inline constexpr int resumable_exit_code = 75;

// What loom::train does with a step whose loss (on any rank) or gradient norm is not finite.
enum class nonfinite_policy {
  // The run stops, naming the step and the rank, before any checkpoint after it: the newest
  // checkpoint is the last good state. Found where the host reads the losses (a logged or checkpointed
  // step), so it costs no read of its own; the steps in between are not saved.
  stop,
  // Every rank skips the step: no optimizer step, no learning-rate step; logged in metrics.jsonl.
  // More than max_skipped_steps in a run stops it as `stop` does. The host reads the step's agreed
  // verdict every step (on a GPU, a wait for the step's backward, as a gradient scaler's skip has).
  skip,
};

[[nodiscard]] std::string_view to_string(nonfinite_policy policy) noexcept;
[[nodiscard]] std::optional<nonfinite_policy> nonfinite_policy_named(std::string_view name) noexcept;

struct train_options {
  std::int64_t steps = 0;             // optimizer steps in all
  int accumulate = 1;                 // micro-batches per optimizer step
  std::optional<double> clip_norm{};  // clip the global gradient norm to this (p = 2); the norm is logged
  std::optional<lr_schedule> lr{};    // none: the optimizer's own rate throughout
  std::filesystem::path out{};        // checkpoints/ and metrics.jsonl, created if missing; empty: no
                                      // files, no resume (a benchmark), and a signal stops unsaved
  std::int64_t checkpoint_every = 0;  // 0: at the end and on preemption only
  int keep_checkpoints = 2;
  bool async_checkpoints = false;           // written on a background thread (checkpoint_options.async_save)
  bool strict_checkpoints = false;          // a damaged newest checkpoint stops the run (checkpoint_options.strict)
  std::int64_t eval_every = 0;              // 0: no evaluation
  std::int64_t log_every = 10;              // a metrics line and a progress line every this many steps
  double log_seconds = 30;                  // or when this long has passed since the last progress line
  std::int64_t tokens_per_micro_batch = 0;  // this rank's, for tokens/s (0: left out)
  std::string name{};                       // starts the progress lines ("pretrain step 80/800 ...")
  bool set_to_none = true;                  // zero_grad drops the gradients (PyTorch's default) or zeroes them
  nonfinite_policy on_nonfinite = nonfinite_policy::stop;
  std::int64_t max_skipped_steps = 10;  // in a run, resumes included, under nonfinite_policy::skip
  // A checkpoint trained over other pretrained(...) weights (of the same shapes) or other data than
  // this run's is refused; true resumes it nonetheless, saying so (checkpoint_options.resume_over_changes).
  bool resume_over_changes = false;
  // What the data is, recorded in every checkpoint and compared on resume (loom::data::text_dataset's
  // identity(): its files' names, sizes and checksums); empty: not compared.
  std::string data_identity{};

  // What a run file's "train" object sets, by the names it gives them (loom/config/run_file.hpp); the
  // rest is the program's to say.
  static constexpr auto fields() {
    return std::tuple{option_field{"steps", &train_options::steps},
                      option_field{"accumulate", &train_options::accumulate},
                      option_field{"clip_norm", &train_options::clip_norm},
                      option_field{"lr", &train_options::lr},
                      option_field{"out", &train_options::out},
                      option_field{"checkpoint_every", &train_options::checkpoint_every},
                      option_field{"keep_checkpoints", &train_options::keep_checkpoints},
                      option_field{"async_checkpoints", &train_options::async_checkpoints},
                      option_field{"strict_checkpoints", &train_options::strict_checkpoints},
                      option_field{"eval_every", &train_options::eval_every},
                      option_field{"log_every", &train_options::log_every},
                      option_field{"log_seconds", &train_options::log_seconds},
                      option_field{"on_nonfinite", &train_options::on_nonfinite},
                      option_field{"max_skipped_steps", &train_options::max_skipped_steps},
                      option_field{"resume_over_changes", &train_options::resume_over_changes}};
  }
};

// The first option loom::train refuses, if any ("steps", "is 0; give at least 1"; the schedule's as
// "lr.peak"): what train() throws for before it builds anything, and what a run file's reader
// refuses when it reads the file.
[[nodiscard]] std::optional<option_problem> train_options_problem(const train_options& options);

struct step_report {
  std::int64_t step = 0;
  double loss = 0;       // averaged over the ranks
  double rank_loss = 0;  // this rank's own
  double step_ms = 0;    // micro-batches, clipping, the optimizer's step and zero_grad
};

struct train_functions {
  // The mean loss of micro-batch `micro` of optimizer step `step` on this rank: job.forward(...).
  std::function<at::Tensor(std::int64_t step, int micro)> loss{};
  // This rank's mean loss on its part of the held-out set (called without gradients); optional.
  std::function<at::Tensor()> eval_loss{};
  // Called on every rank at each evaluation's step (eval_every), after eval_loss, without gradients
  // and with the weights' average in place when the run keeps one: sampling from the model, say;
  // optional.
  std::function<void(std::int64_t step)> validate{};
  // Called on every rank after each optimizer step (zero_grad included), with the step's mean loss
  // over the ranks and this rank's wall time of the whole step; optional.
  std::function<void(const step_report&)> on_step{};
  // The data's position on this rank after the batches loss() has drawn so far (a text:
  // loom::data::text_dataset's or read_ahead's state()), saved in this rank's file of each checkpoint,
  // and the function that puts it back on resume; both or neither. A run resumed from a checkpoint
  // saved by another number of ranks is refused: a rank's position cannot be split or joined.
  std::function<std::string()> data_state{};
  std::function<void(const std::string&)> restore_data{};
};

// Throws std::invalid_argument for functions loom::train cannot run with: no loss, or one of
// data_state and restore_data without the other.
void check_train_functions(const train_functions& functions);

enum class train_outcome { finished, preempted };

// An evaluation: its step and its loss averaged over the ranks.
struct eval_point {
  std::int64_t step = 0;
  double loss = 0;
};

struct train_result {
  train_outcome outcome = train_outcome::finished;
  std::int64_t last_step = 0;   // the last optimizer step taken (and checkpointed)
  std::int64_t first_step = 1;  // where this run started: after the checkpoint it resumed from
  double last_loss = 0;         // averaged over the ranks
  double seconds = 0;           // this run's wall time, from the start of train() (a resumed one's own)
  // This run's evaluations (none without eval_loss): the lowest loss, and the last.
  std::optional<eval_point> best_eval{}, last_eval{};
  // Each rank's peak memory in bytes, by rank (loom/runtime/peak_memory.hpp says what is counted).
  std::vector<std::int64_t> peak_memory_bytes{};
};

// The parts of the loop that do not depend on the job's type (src/train/loop.cpp).
class train_session {
 public:
  // Checks the options and that out/ can be written, and locks out/ for this job (rank 0 holds the
  // lock, released when the session ends; a second job is refused, naming the holder), before any
  // step; installs the SIGTERM, SIGUSR1 and SIGINT handlers (restored when the session ends; a
  // second SIGINT stops at once).
  train_session(const runtime& rt, const train_options& options);
  ~train_session();
  train_session(const train_session&) = delete;
  train_session& operator=(const train_session&) = delete;

  // False when options().out is empty: nothing is saved or resumed.
  [[nodiscard]] bool checkpoints_enabled() const noexcept { return checkpoints_ != nullptr; }
  [[nodiscard]] checkpointer& checkpoints() noexcept { return *checkpoints_; }
  [[nodiscard]] const train_options& options() const noexcept { return options_; }

  // Continues from `resumed`: a checkpoint past options().steps is refused, naming what to do
  // (std::invalid_argument, on every rank); the steps skipped before it count, the data's position is
  // restored (through functions.restore_data, on every rank or none), and rank 0 says where it continues.
  // `tensor_parallel`: the job's (its ranks read batches by tensor group).
  void resume_from(const resume_point& resumed, const train_functions& functions, int tensor_parallel);
  // What loom::train saves in the manifest with step `step`'s checkpoint (JSON).
  [[nodiscard]] std::string checkpoint_state(std::int64_t step) const;
  void begin_step(std::int64_t step, torch::optim::Optimizer& optimizer);
  // After the last micro-batch's forward, before its backward: `loss_sum` is this rank's summed
  // micro-batch losses, on the device. Starts the step's one small all-reduce, on the device, so that
  // it travels during the backward: the loss's mean over the ranks, which ranks' losses are not
  // finite, and whether any rank was asked to stop.
  void share_loss(const at::Tensor& loss_sum);
  // After the step's backward (and clipping, whose norm `grad_norm` is, on the device): keeps the
  // step's loss, norm and stop on the device, and reads them on a step that is logged, checkpointed
  // or the last, where the run stops, every step with `report` (then they are in
  // step_loss() and rank_loss()), and every step under nonfinite_policy::skip. A stop is learnt of at
  // every step on the CPU and at the steps every rank reads on a GPU (preempted()). Returns whether to
  // update: false for a step skipped. Throws on a read that finds a loss or norm that was not finite
  // (beyond the skips allowed), naming the first such step and rank: before the update of the step
  // that read it, and before any checkpoint after it.
  [[nodiscard]] bool end_step(std::int64_t step, const at::Tensor& grad_norm, bool report);
  // The step's loss averaged over the ranks, and this rank's own: read at end_step(..., report = true).
  [[nodiscard]] double step_loss() const noexcept { return step_loss_; }
  [[nodiscard]] double rank_loss() const noexcept { return rank_loss_; }
  [[nodiscard]] bool preempted() const noexcept { return preempted_; }
  // The last step's loss averaged over the ranks, as last read (the run's last step is always read).
  [[nodiscard]] double last_loss() const noexcept { return step_loss_; }
  [[nodiscard]] bool checkpoint_due(std::int64_t step) const noexcept;
  [[nodiscard]] bool eval_due(std::int64_t step) const noexcept;
  // Averages this rank's eval loss over the ranks and logs it with the step.
  void record_eval(std::int64_t step, const at::Tensor& loss);
  // Called in a catch block of step `step`: the exception under way becomes the job's error, as in a
  // pass (a peer's published failure, the ranks that are gone, or this rank's own, published), so
  // that a collective of the loop's own (the loss's, the clipping's) that breaks says why.
  [[noreturn]] void fail_step(std::int64_t step) const;
  // Sizes for the metrics: this rank's parameters (what the optimizer steps) and optimizer state;
  // measured before the first step and again after it, when the optimizer's state exists.
  void measure_memory(const torch::optim::Optimizer& optimizer);
  // At the end of the run (finished or preempted; every rank): fills `result`'s time, evaluations and
  // each rank's peak memory (gathered, a collective), and rank 0 says them in one line, with the
  // files the loop wrote, and writes them to out/summary.json.
  void summarize(train_result& result) const;

 private:
  void prepare_run_folder();
  // Reads what the device holds of the steps so far (one copy), at `step`, with its gradient norm or
  // without; throws when a loss or norm was not finite and is not to be skipped. Returns whether step
  // `step` is skipped.
  bool read_losses(std::int64_t step, bool with_norm);
  [[noreturn]] void stop_nonfinite(std::int64_t bad_step, double loss, double bad_rank, double norm,
                                   std::int64_t at_step) const;
  void log(std::int64_t step);
  void write_metrics(const std::string& line) const;  // one JSON line, rank 0, when out/ is set

  runtime rt_;
  train_options options_;
  std::unique_ptr<run_folder_lock> lock_;  // rank 0's; released after the checkpointer's last write
  std::unique_ptr<checkpointer> checkpoints_;
  std::int64_t first_logged_step_ = 0;
  std::chrono::steady_clock::time_point started_, step_started_, last_progress_;
  double step_ms_ = 0, lr_ = 0, parameters_mb_ = 0, optimizer_mb_ = 0;
  std::optional<double> grad_norm_, eval_loss_;
  std::optional<eval_point> best_eval_, last_eval_;
  // This rank's mean loss of the step, at 1 + r whether rank r's is not finite and last whether this
  // rank was asked to stop; then summed over the ranks (device).
  at::Tensor shared_loss_;
  pending_collective loss_reduction_;
  // On the device, updated each step without a read: the finite losses summed since the last log, the
  // step's mean loss and this rank's, the step's gradient norm, whether the step is not finite and the
  // lowest rank whose loss is not (-1: none), and the first such step of the run (0: none) with its
  // loss, rank and norm (tracked_slot).
  at::Tensor tracked_;
  double step_loss_ = 0, rank_loss_ = 0, loss_since_log_ = 0, stop_asked_ = 0;
  std::int64_t steps_since_log_ = 0, steps_this_run_ = 0;
  std::int64_t skipped_steps_ = 0;  // in the run, resumes included
  bool preempted_ = false;
  struct signal_handlers;
  std::unique_ptr<signal_handlers> handlers_;
};

namespace detail {

// loom::train, with the weights' moving average or without (`averages` null).
template <class Job>
train_result train_loop(Job& job, torch::optim::Optimizer& optimizer, ema* averages, const train_functions& functions,
                        const train_options& options) {
  check_train_functions(functions);
  train_session session(job.rt(), options);
  train_result result;
  const auto resume = [&] {
    checkpointer& checkpoints = session.checkpoints();
    return averages ? checkpoints.resume(job, optimizer, *averages) : checkpoints.resume(job, optimizer);
  };
  if (const auto resumed = session.checkpoints_enabled() ? resume() : std::optional<resume_point>{}) {
    result.first_step = resumed->step + 1;
    session.resume_from(*resumed, functions, job.tensor_parallel_size());
  }
  result.last_step = result.first_step - 1;
  session.measure_memory(optimizer);
  for (std::int64_t step = result.first_step; step <= options.steps; ++step) {
    try {
      const auto step_started = std::chrono::steady_clock::now();
      session.begin_step(step, optimizer);
      at::Tensor loss_sum;
      for (int micro = 0; micro < options.accumulate; ++micro) {
        const auto run_micro_batch = [&] {
          at::Tensor loss = functions.loss(step, micro);
          if (const auto factor = injected_value("train.loss")) loss = loss * *factor;
          loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
          if (micro + 1 == options.accumulate) session.share_loss(loss_sum);
          job.backward(loss / options.accumulate);
        };
        if (micro + 1 < options.accumulate) {
          auto accumulate = job.no_sync();
          run_micro_batch();
        } else {
          run_micro_batch();
        }
      }
      failpoint("step.clip");  // after the backward: the peers go on into the clipping's all-reduce
      at::Tensor norm;
      if (options.clip_norm) norm = job.clip_grad_norm(*options.clip_norm);
      // Before the update, which a step that is not finite may skip.
      if (session.end_step(step, norm, /*report=*/static_cast<bool>(functions.on_step))) {
        failpoint("step.optimizer");
        optimizer.step();
        if (averages) averages->update(step);
      }
      job.zero_grad(options.set_to_none);
      if (functions.on_step) {
        // The step's time includes its device work: wait for the kernels it queued.
        wait_for_device(job.rt().progress(), job.rt().device());
        const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - step_started;
        functions.on_step(
            {.step = step, .loss = session.step_loss(), .rank_loss = session.rank_loss(), .step_ms = took.count()});
      }
      if (step == result.first_step) session.measure_memory(optimizer);
      result.last_step = step;
      if ((functions.eval_loss || functions.validate) && session.eval_due(step)) {
        const c10::NoGradGuard no_grad;
        const std::optional<ema::weights_swap> averaged =
            averages ? std::optional<ema::weights_swap>(std::in_place, *averages) : std::nullopt;
        if (functions.eval_loss) session.record_eval(step, functions.eval_loss());
        if (functions.validate) functions.validate(step);
      }
      if (session.checkpoints_enabled()) {
        checkpointer& checkpoints = session.checkpoints();
        checkpoints.poll();
        if (session.checkpoint_due(step) || session.preempted()) {
          const std::string state = session.checkpoint_state(step);
          const std::string data = functions.data_state ? functions.data_state() : std::string();
          if (averages) {
            checkpoints.save(job, optimizer, *averages, step, state, data);
          } else {
            checkpoints.save(job, optimizer, step, state, data);
          }
        }
      }
      if (session.preempted()) {
        result.outcome = train_outcome::preempted;
        break;
      }
    } catch (...) {
      session.fail_step(step);
    }
  }
  // The end of the run, and a preemption, wait for the save in flight.
  if (session.checkpoints_enabled()) session.checkpoints().wait();
  result.last_loss = session.last_loss();
  session.summarize(result);
  return result;
}

}  // namespace detail

template <class Job>
train_result train(Job& job, torch::optim::Optimizer& optimizer, const train_functions& functions,
                   const train_options& options) {
  return detail::train_loop(job, optimizer, nullptr, functions, options);
}

// The same, keeping `averages` (loom::ema) of the weights: updated after each optimizer step, the
// weights during each evaluation, and saved and resumed with every checkpoint. Save the averaged
// weights after it with averages.swapped_in().
template <class Job>
train_result train(Job& job, torch::optim::Optimizer& optimizer, ema& averages, const train_functions& functions,
                   const train_options& options) {
  return detail::train_loop(job, optimizer, &averages, functions, options);
}

}  // namespace loom
