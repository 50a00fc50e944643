// Ranks that disagree must fail together, fast, with a message that names what differs, never
// hang. Usage (under loom-run): dist-failures MODE. Every rank expects its error; it prints it and
// exits 0 when the message and the time are as they should be, 1 otherwise.
#include "branchy.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <models/mlp.hpp>

#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <regex>
#include <string>

using loom::testing::branchy;
using loom::testing::world;

namespace {

bool last_rank() { return world().rank() == world().world_size() - 1; }

struct scenario {
  std::function<void()> run;  // must throw
  std::string expected;       // a regex the message must contain
};

const std::map<std::string, scenario>& scenarios() {
  static const std::map<std::string, scenario> all{
      {"different-model",
       {[] {
          // The last rank builds one more layer, as if an environment variable chose the depth.
          auto job = loom::build(loom::model<models::Mlp>(8, last_rank() ? 4 : 3) | loom::seeded(3) | loom::ddp(), world());
        },
        "seeded\\(3\\) should build bit-identical replicas on every rank, but tensor #6 differs between rank 0 "
        "\\('\\(none\\)'\\) and rank \\d \\('layers.3.weight Float\\[8,8\\]'\\)"}},
      {"different-values",
       {[] {
          auto job = loom::build(loom::model<models::Mlp>(8, 3) | loom::seeded(last_rank() ? 4 : 3) | loom::ddp(), world());
        },
        "tensor #0 differs between rank 0 \\('layers.0.weight Float\\[8,8\\]'\\) and rank \\d .* in its values"}},
      {"different-schedule",
       {[] {
          const std::size_t cap = last_rank() ? 1 : 25;
          auto job = loom::build(
              loom::model<models::Mlp>(512, 4) | loom::seeded(3) | loom::ddp({.bucket_cap_mb = cap}), world());
        },
        "the ranks' collective schedules differ.*first difference at entry #1: rank 0 has 'all_reduce backward "
        "world \\d+ B \\[layers.2.bias"}},
      {"unused-without-option",
       {[] {
          auto job = loom::build(loom::model<branchy>() | loom::seeded(3) | loom::ddp(), world());
          auto x = torch::randn({4, 8});
          job.backward(job.forward(x, !last_rank()).square().mean());
          job.backward(job.forward(x, !last_rank()).square().mean());
        },
        "parameter 'extra.(weight|bias)' received no gradient on rank \\d in this step.*"
        "find_unused_parameters = true"}},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || !scenarios().contains(argv[1])) {
    std::cerr << "usage: dist-failures MODE (different-model, different-values, different-schedule, unused-without-option)\n";
    return 2;
  }
  const auto& [run, expected] = scenarios().at(argv[1]);
  (void)world();
  const auto start = std::chrono::steady_clock::now();
  try {
    run();
  } catch (const std::exception& error) {
    const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string message = error.what();
    const bool matches = std::regex_search(message, std::regex(expected));
    std::cout << (matches ? "expected" : "UNEXPECTED") << " failure after " << seconds << " s: " << message << '\n';
    if (!matches) std::cout << "expected a message matching: " << expected << '\n';
    return matches && seconds < 10 ? 0 : 1;
  }
  std::cout << "UNEXPECTED: " << argv[1] << " did not fail\n";
  return 1;
}
