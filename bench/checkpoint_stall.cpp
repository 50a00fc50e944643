// checkpoint-stall: what a checkpoint costs the training loop (docs/benchmarks.md, "Checkpoints").
// A TinyGpt under local() with AdamW saves, alternately, synchronously and asynchronously. The
// stall of a save is the training thread's time in it: save() itself, and, for an asynchronous
// one, the poll() after each step until it completes (then wait(), when it outlasts
// --max-steps). The background write also slows the steps that run beside it (the two share the
// cores and the memory bus): their time above a step's without it is reported too, and with the
// stall, as the loop's whole cost of the save. Also the checksum's share of a save: XXH3-64 over
// the bytes of the file written, in memory.
//
//   build/bench/checkpoint-stall --repetitions 5 --d 1024 --layers 8 --folder /var/tmp/loom-stall

#include "statistics.hpp"

#include <common/command_line.hpp>
#include <loom/loom.hpp>
#include <loom/optim/adamw.hpp>
#include <models/tiny_gpt.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

struct options {
  int repetitions = 5;
  std::int64_t d = 1024;
  std::int64_t layers = 8;
  int plain_steps = 4;  // steps timed after each synchronous save
  int max_steps = 40;   // steps at most while an asynchronous save writes
  fs::path folder = "/var/tmp/loom-checkpoint-stall";
};

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  options opts;
  CLI::App app("the stall of a synchronous and an asynchronous checkpoint save", "checkpoint-stall");
  app.add_option("--repetitions", opts.repetitions, "saves of each kind, alternating")->check(CLI::PositiveNumber);
  app.add_option("--d", opts.d, "the model's width")->check(CLI::PositiveNumber);
  app.add_option("--layers", opts.layers, "the model's blocks")->check(CLI::PositiveNumber);
  app.add_option("--plain-steps", opts.plain_steps, "steps timed after each synchronous save")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-steps", opts.max_steps, "steps at most while an asynchronous save writes")
      ->check(CLI::PositiveNumber);
  app.add_option("--folder", opts.folder, "where the checkpoints go (removed first)");
  if (const auto exit_code = recipes::parse_command_line(app, argc, argv)) return *exit_code;

  const models::tiny_gpt_config config{.vocab = 256, .d = opts.d, .layers = opts.layers, .heads = 8, .ctx = 32};
  const loom::runtime rt = loom::runtime::single_process();
  auto job = loom::build(loom::model<models::TinyGpt>(config) | loom::seeded(1) | loom::local(), rt);
  loom::optim::AdamW optimizer(job.trainable_parameters());
  const at::Tensor tokens = at::randint(0, config.vocab, {2, config.ctx});
  const auto step = [&] {
    job.backward(job.forward(tokens, tokens.roll(-1, 1)));
    optimizer.step();
    job.zero_grad();
  };
  step();  // the optimizer's state exists from here

  fs::remove_all(opts.folder);
  loom::checkpointer sync(rt, {.folder = opts.folder / "sync", .keep = 1});
  loom::checkpointer background(rt, {.folder = opts.folder / "async", .keep = 1, .async_save = true});
  std::vector<double> sync_stall, async_stall, async_copy, stall_ratio, cost_ratio, plain_steps, writing_steps,
      hash_share, hash_gbps;
  std::int64_t saved = 0;
  for (int r = 0; r < opts.repetitions; ++r) {
    ++saved;
    auto start = clock_type::now();
    sync.save(job, optimizer, saved);
    sync_stall.push_back(seconds_since(start));
    std::vector<double> plain;
    for (int s = 0; s < opts.plain_steps; ++s) {
      start = clock_type::now();
      step();
      plain.push_back(seconds_since(start));
    }
    const double plain_step = bench::median(plain);
    plain_steps.insert(plain_steps.end(), plain.begin(), plain.end());

    start = clock_type::now();
    background.save(job, optimizer, saved);
    double stalled = seconds_since(start);
    async_copy.push_back(stalled);
    double slowed = 0;  // the steps' time above plain_step while the file is written
    for (int s = 0; s < opts.max_steps && background.saving(); ++s) {
      start = clock_type::now();
      step();
      const double took = seconds_since(start);
      writing_steps.push_back(took);
      slowed += took - plain_step;
      start = clock_type::now();
      background.poll();
      stalled += seconds_since(start);
    }
    start = clock_type::now();
    background.wait();
    stalled += seconds_since(start);
    async_stall.push_back(stalled);
    stall_ratio.push_back(stalled / sync_stall.back());
    cost_ratio.push_back((stalled + slowed) / sync_stall.back());

    // The checksum's share: hashing the file's bytes, already in memory, against the whole save.
    const fs::path file = opts.folder / "sync" / fmt::format("step-{:08}", saved) / "rank-00000.safetensors";
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    start = clock_type::now();
    const std::uint64_t hash = loom::xxh3_of(bytes.data(), bytes.size());
    const double hashing = seconds_since(start);
    if (hash == 0) fmt::print("(a hash of 0)\n");  // keeps the hash from being optimised away
    hash_share.push_back(hashing / sync_stall.back());
    hash_gbps.push_back(static_cast<double>(bytes.size()) / hashing / 1e9);
    if (r == 0) fmt::print("rank file: {:.0f} MB\n", static_cast<double>(bytes.size()) / 1e6);
  }
  fmt::print("synchronous save stalls the loop {:.3f} s (median of {}; {})\n", bench::median(sync_stall),
             opts.repetitions, bench::spread(sync_stall));
  fmt::print("asynchronous save stalls it {:.3f} s ({}), of which save() copying the state {:.3f} s\n",
             bench::median(async_stall), bench::spread(async_stall), bench::median(async_copy));
  fmt::print("stall ratio (asynchronous / synchronous) {:.3f} (paired {})\n",
             bench::median(async_stall) / bench::median(sync_stall), bench::spread(stall_ratio));
  fmt::print(
      "a step takes {:.3f} s, {:.3f} s beside a background write ({} and {} steps); the loop's whole cost "
      "of an asynchronous save, stall and slower steps, against a synchronous one: {:.3f} (paired {})\n",
      bench::median(plain_steps), writing_steps.empty() ? 0.0 : bench::median(writing_steps), plain_steps.size(),
      writing_steps.size(), bench::median(cost_ratio), bench::spread(cost_ratio));
  fmt::print("XXH3-64 of the file: {:.1f} GB/s, {:.1f} % of a synchronous save ({})\n", bench::median(hash_gbps),
             100 * bench::median(hash_share), bench::spread(hash_share));
  fs::remove_all(opts.folder);
  return 0;
}
