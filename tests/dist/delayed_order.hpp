#pragma once
// The order of a strategy's collectives under random delays: the schedule entries a job issued,
// recorded by its cursor, with each rank held up at random points of its backward, compared across
// ranks and runs.

#include "hooked_units.hpp"
#include "world.hpp"

#include <loom/job/build.hpp>

#include <ATen/ATen.h>

#include <catch2/catch_test_macros.hpp>

#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <utility>
#include <vector>

namespace loom::testing {

// Three steps of two micro-batches (the first under job.no_sync()) of a job over hooked_units of
// width `width`; before each unit's backward, this rank sleeps up to 20 ms one time in two, drawn
// from `run` and the rank. Returns the entries issued, pass by pass, each pass ended by -1: what
// every rank and every run must agree on.
template <class Job>
at::Tensor issued_under_delays(Job& job, std::int64_t width, unsigned run) {
  std::mt19937 draws(1000 * run + static_cast<unsigned>(world().rank()));
  job.module().in_backward = [&draws](int) {
    if (draws() % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(draws() % 20000));
  };
  std::vector<std::int64_t> issued;
  for (int step = 0; step < 3; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(100 * step + 10 * micro) +
                                                          static_cast<std::uint64_t>(world().rank()));
      const at::Tensor loss = job.forward(at::randn({2, width}, gen)).square().mean();
      if (micro == 0) {
        auto accumulate = job.no_sync();
        job.backward(loss);
      } else {
        job.backward(loss);
      }
      for (const std::size_t entry : job.strategy().issued_entries())
        issued.push_back(static_cast<std::int64_t>(entry));
      issued.push_back(-1);
    }
    job.zero_grad();
  }
  job.module().in_backward = nullptr;
  return at::tensor(issued, at::kLong);
}

// Builds `plan` (over hooked_units of width `width`) three times, each run with other delays, and
// checks that every rank issued the same sequence and every run the first one's; returns the first
// run's sequence and its schedule's number of entries.
template <class Plan>
std::pair<at::Tensor, std::int64_t> check_order_under_delays(const Plan& plan, std::int64_t width) {
  at::Tensor first;
  std::int64_t entries = 0;
  for (unsigned run = 0; run < 3; ++run) {
    CAPTURE(run);
    auto job = loom::build(plan, world());
    const at::Tensor issued = issued_under_delays(job, width, run);
    CHECK(same_on_every_rank(issued));
    if (run == 0) {
      first = issued;
      entries = static_cast<std::int64_t>(job.schedule().entries().size());
    }
    CHECK(at::equal(issued, first));
  }
  return {first, entries};
}

}  // namespace loom::testing
