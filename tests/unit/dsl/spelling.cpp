// "Did you mean": the distance a typist counts, and which names are close enough to offer.
#include <loom/base/spelling.hpp>

#include <catch2/catch_test_macros.hpp>

#include <string>
#include <vector>

TEST_CASE("edit_distance counts insertions, deletions, substitutions and adjacent swaps as one edit each") {
  CHECK(loom::edit_distance("", "") == 0);
  CHECK(loom::edit_distance("", "out") == 3);
  CHECK(loom::edit_distance("steps", "steps") == 0);
  CHECK(loom::edit_distance("stpes", "steps") == 1);  // a swap
  CHECK(loom::edit_distance("step", "steps") == 1);
  CHECK(loom::edit_distance("q_prj", "q_proj") == 1);
  CHECK(loom::edit_distance("kitten", "sitting") == 3);
  CHECK(loom::edit_distance("ab", "ba") == 1);
  CHECK(loom::edit_distance("abc", "ca") == 3);  // optimal string alignment, not full Damerau
}

TEST_CASE("closest_names offers near slips and the names a word begins, nearest first, and nothing far") {
  const std::vector<std::string> flags{"--steps-pretrain", "--steps-adapt", "--checkpoint-every", "--out"};
  CHECK(loom::closest_names("--steps", flags) == std::vector<std::string>{"--steps-pretrain", "--steps-adapt"});
  CHECK(loom::closest_names("--otu", flags) == std::vector<std::string>{"--out"});
  CHECK(loom::closest_names("--lora.rank", flags).empty());
  CHECK(loom::closest_names("--out", flags).empty());  // the name itself is no suggestion

  const std::vector<std::string> keys{"train.steps", "train.lr.peak", "train.clip_norm", "lora.rank"};
  CHECK(loom::closest_names("train.setps", keys) == std::vector<std::string>{"train.steps"});
  CHECK(loom::closest_names("train.clipnorm", keys) == std::vector<std::string>{"train.clip_norm"});
  // A key without its section (`--steps 100` for `--train.steps=100`), however far the whole key is.
  CHECK(loom::closest_names("steps", keys) == std::vector<std::string>{"train.steps"});
  CHECK(loom::closest_names("lr.peak", keys) == std::vector<std::string>{"train.lr.peak"});
  CHECK(loom::closest_names("eak", keys).empty());  // an ending, not after a dot
}

TEST_CASE("did_you_mean ends a refusal with up to three names, or with nothing") {
  const std::vector<std::string> targets{"q_proj", "k_proj", "v_proj", "o_proj"};
  CHECK(loom::did_you_mean("q_prj", targets) == " (did you mean 'q_proj'?)");
  CHECK(loom::did_you_mean("x_proj", targets) == " (did you mean 'q_proj', 'k_proj' or 'v_proj'?)");
  CHECK(loom::did_you_mean("embed", targets).empty());
  CHECK(loom::did_you_mean("--stpes", {"--steps"}, "") == " (did you mean --steps?)");
}
