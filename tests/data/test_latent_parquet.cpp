// loom::data::latent_parquet_dataset on datasets that pyarrow writes in FastVideo's own format
// (dsl_examples/data/make_fastvideo_parquet.py: 11 clips from 2 workers, 4 rows a file, 3 a row
// group): every value as Python wrote it, the text cut or padded with its mask; each epoch ranks
// 0..W-1 together read every row once, at 1, 2 and 3 ranks, in an order that changes with the
// epoch; a dataset restored from any batch's state gives the uninterrupted run's batches after it,
// read ahead or not; the held-out split; and each kind of bad file or row named in its sentence.
#include <loom/data/latent_parquet.hpp>

#include "scratch_folder.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;
using loom::data::latent_batch;
using loom::data::latent_parquet_dataset;
using loom::data::latent_parquet_options;
using nlohmann::json;

namespace {

constexpr std::int64_t clips = 11;

void run_python(const std::string& arguments) {
  const std::string command = fmt::format("'{}' {} > /dev/null", LOOM_PYTHON, arguments);
  if (std::system(command.c_str()) != 0) FAIL("failed: " << command);
}

// What make_fastvideo_parquet.py wrote, a row a clip, in the dataset's order (the files' paths').
struct written {
  loom::testing::scratch_folder folder;
  std::vector<json> rows;

  written() {
    run_python(
        fmt::format("'{}/dsl_examples/data/make_fastvideo_parquet.py' '{}' --clips {} --workers 2 "
                    "--rows-per-file 4 --row-group-size 3 --channels 4 --frames 2 --height 4 --width 4 "
                    "--text-dim 16 --max-tokens 6 --seed 1 --expected '{}'",
                    LOOM_SOURCE_DIR, folder.path().string(), clips, (folder.path() / "expected.jsonl").string()));
    std::ifstream in(folder.path() / "expected.jsonl");
    for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
    std::ranges::sort(rows, [](const json& a, const json& b) {
      return std::pair{a["file"].get<std::string>(), a["row"].get<int>()} <
             std::pair{b["file"].get<std::string>(), b["row"].get<int>()};
    });
  }
  [[nodiscard]] fs::path data() const { return folder.path() / "combined_parquet_dataset"; }
};

const written& dataset() {
  static const written once;
  return once;
}

latent_parquet_options options_for(int rank = 0, int world_size = 1) {
  latent_parquet_options options;
  options.paths = {dataset().data()};
  options.text_len = 4;
  options.seed = 7;
  options.rank = rank;
  options.world_size = world_size;
  return options;
}

// The rows a rank's batches give, in order, until `count`.
std::vector<std::int64_t> rows_read(latent_parquet_dataset& data, std::int64_t count) {
  std::vector<std::int64_t> rows;
  while (static_cast<std::int64_t>(rows.size()) < count) {
    const latent_batch batch = data.next();
    rows.insert(rows.end(), batch.rows.begin(), batch.rows.end());
  }
  rows.resize(static_cast<std::size_t>(count));
  return rows;
}

bool same(const latent_batch& a, const latent_batch& b) {
  return a.rows == b.rows && a.ids == b.ids && a.latents == b.latents && a.text == b.text &&
         a.text_mask == b.text_mask && a.latents_shape == b.latents_shape && a.text_shape == b.text_shape;
}

}  // namespace

TEST_CASE("every clip decodes to what Python wrote, its text cut or padded to text_len with its mask") {
  const std::int64_t ahead = GENERATE(0, 2);
  latent_parquet_options options = options_for();
  options.shuffle = false;
  options.read_ahead = ahead;
  latent_parquet_dataset data(options);
  CHECK(data.rows() == clips);
  CHECK(data.rank_rows() == clips);
  std::set<std::int64_t> tokens_seen;
  for (std::int64_t row = 0; row < clips; ++row) {
    const latent_batch batch = data.next();
    const json& expected = dataset().rows[static_cast<std::size_t>(row)];
    REQUIRE(batch.rows == std::vector<std::int64_t>{row});
    CHECK(batch.ids == std::vector<std::string>{expected["id"].get<std::string>()});
    CHECK(batch.latents_shape == std::array<std::int64_t, 5>{1, 4, 2, 4, 4});
    CHECK(batch.latents == expected["latent"].get<std::vector<float>>());
    const std::vector<float> text = expected["text"].get<std::vector<float>>();
    const std::int64_t tokens = expected["text_shape"][0].get<std::int64_t>();
    tokens_seen.insert(tokens);
    CHECK(batch.text_shape == std::array<std::int64_t, 3>{1, 4, 16});
    for (std::int64_t t = 0; t < 4; ++t) {
      CHECK(batch.text_mask[static_cast<std::size_t>(t)] == (t < tokens ? 1 : 0));
      for (std::int64_t d = 0; d < 16; ++d) {
        const auto i = static_cast<std::size_t>(t * 16 + d);
        CHECK(batch.text[i] == (t < tokens ? text[i] : 0.0F));
      }
    }
  }
  // Prompts both shorter and longer than text_len were read.
  CHECK(*tokens_seen.begin() < 4);
  CHECK(*tokens_seen.rbegin() > 4);
  CHECK(data.epoch() == 1);
  CHECK(data.next().rows == std::vector<std::int64_t>{0});
}

TEST_CASE("each epoch the ranks together read every row once, in an order that changes with the epoch") {
  const int world_size = GENERATE(1, 2, 3);
  std::vector<std::int64_t> epochs[2];
  for (int rank = 0; rank < world_size; ++rank) {
    latent_parquet_options options = options_for(rank, world_size);
    options.batch_size = 2;
    latent_parquet_dataset data(options);
    const std::vector<std::int64_t> rows = rows_read(data, 2 * data.rank_rows());
    const auto half = rows.begin() + data.rank_rows();
    epochs[0].insert(epochs[0].end(), rows.begin(), half);
    epochs[1].insert(epochs[1].end(), half, rows.end());
  }
  CHECK(epochs[0] != epochs[1]);
  for (std::vector<std::int64_t>& epoch : epochs) {
    std::ranges::sort(epoch);
    std::vector<std::int64_t> all(clips);
    for (std::int64_t i = 0; i < clips; ++i) all[static_cast<std::size_t>(i)] = i;
    CHECK(epoch == all);
  }
}

TEST_CASE("another seed gives another order; no shuffle gives the files' order") {
  latent_parquet_options options = options_for();
  latent_parquet_dataset seven(options);
  options.seed = 8;
  latent_parquet_dataset eight(options);
  CHECK(rows_read(seven, clips) != rows_read(eight, clips));
}

TEST_CASE("a dataset restored from a batch's state gives the uninterrupted run's batches after it") {
  const std::int64_t ahead = GENERATE(0, 1, 3);
  latent_parquet_options options = options_for(1, 2);
  options.batch_size = 3;
  options.read_ahead = ahead;
  latent_parquet_dataset whole(options);
  std::vector<latent_batch> batches;
  std::vector<std::string> states;
  for (int n = 0; n < 8; ++n) {  // over three epochs of rank 1's 6 rows
    batches.push_back(whole.next());
    states.push_back(whole.state());
  }
  for (std::size_t n = 0; n + 1 < batches.size(); ++n) {
    latent_parquet_dataset resumed(options);
    resumed.restore(states[n]);
    for (std::size_t k = n + 1; k < batches.size(); ++k) CHECK(same(resumed.next(), batches[k]));
  }
  // Back to an early state on a dataset that has read ahead past it.
  whole.restore(states[1]);
  for (std::size_t k = 2; k < batches.size(); ++k) CHECK(same(whole.next(), batches[k]));
}

TEST_CASE("a state is refused by a dataset of other options or ranks") {
  latent_parquet_dataset data(options_for());
  (void)data.next();
  latent_parquet_options options = options_for();
  options.seed = 9;
  latent_parquet_dataset other(options);
  CHECK_THROWS_WITH(other.restore(data.state()), ContainsSubstring("\"seed\" is 7, this dataset's is 9"));
  latent_parquet_dataset rank_one(options_for(1, 2));
  CHECK_THROWS_WITH(rank_one.restore(data.state()), ContainsSubstring("\"rank\""));
}

TEST_CASE("the held-out split is the last rows, read by at() in the order asked") {
  latent_parquet_options options = options_for();
  options.held_out_fraction = 0.2;  // ⌊2.2⌋ = 2 of 11
  latent_parquet_dataset train(options);
  CHECK(train.rows() == 9);
  CHECK(train.held_out_rows() == 2);
  std::vector<std::int64_t> rows = rows_read(train, 9);
  std::ranges::sort(rows);
  CHECK(rows.back() == 8);
  options.split = loom::data::latent_split::held_out;
  latent_parquet_dataset held(options);
  CHECK(held.rows() == 2);
  const std::vector<std::int64_t> asked{1, 0};
  const latent_batch batch = held.at(asked);
  CHECK(batch.rows == asked);
  CHECK(batch.ids == std::vector<std::string>{dataset().rows[10]["id"].get<std::string>(),
                                              dataset().rows[9]["id"].get<std::string>()});
  CHECK(batch.latents_shape == std::array<std::int64_t, 5>{2, 4, 2, 4, 4});
  CHECK_THROWS_WITH(held.at(std::vector<std::int64_t>{2}),
                    ContainsSubstring("row 2 is not in the held_out split's 2 rows"));
}

TEST_CASE("identity names the files by their paths under the folder and changes with them") {
  const latent_parquet_dataset data(options_for());
  CHECK_THAT(data.identity(), ContainsSubstring("worker_0/data_chunk_0.parquet"));
  CHECK_THAT(data.identity(), ContainsSubstring("(4 files, "));
  CHECK(latent_parquet_dataset(options_for(1, 3)).identity() == data.identity());
}

TEST_CASE("a bad file or row is refused naming the file, the row group and the row") {
  const std::int64_t ahead = GENERATE(0, 2);
  const loom::testing::scratch_folder scratch;
  const auto written_case = [&](const std::string& name) {
    const fs::path file = scratch.path() / name / "data_chunk_0.parquet";
    run_python(fmt::format("'{}/tests/data/fastvideo_parquet_cases.py' {} '{}'", LOOM_SOURCE_DIR, name, file.string()));
    latent_parquet_options options;
    options.paths = {file.parent_path()};
    options.read_ahead = ahead;
    options.batch_size = 4;
    return options;
  };
  SECTION("a truncated file") {
    const fs::path file = scratch.path() / "data_chunk_0.parquet";
    fs::copy_file(dataset().data() / "worker_0" / "data_chunk_0.parquet", file);
    fs::resize_file(file, fs::file_size(file) / 2);
    latent_parquet_options options;
    options.paths = {file};
    CHECK_THROWS_WITH(latent_parquet_dataset(options),
                      ContainsSubstring(file.string() + " is not a whole Parquet file (it does not end in PAR1)") &&
                          ContainsSubstring("truncated"));
  }
  SECTION("a missing column") {
    CHECK_THROWS_WITH(
        latent_parquet_dataset(written_case("no-text-shape")),
        ContainsSubstring("is not one of FastVideo's datasets: it has no column \"text_embedding_shape\""));
  }
  SECTION("a column of another type") {
    CHECK_THROWS_WITH(
        latent_parquet_dataset(written_case("shape-as-string")),
        ContainsSubstring("column \"vae_latent_shape\" is string, and FastVideo's schema has list<int64>"));
  }
  SECTION("bytes too few for the shape") {
    latent_parquet_dataset data(written_case("short-bytes"));
    CHECK_THROWS_WITH(data.next(), ContainsSubstring("data_chunk_0.parquet, row group 0, row 1 (id 'bad-1'): "
                                                     "vae_latent_bytes has 100 bytes, and vae_latent_shape [4, 2, 4, "
                                                     "4] in float32 needs 512"));
  }
  SECTION("a dtype other than float32") {
    latent_parquet_dataset data(written_case("float16"));
    CHECK_THROWS_WITH(data.next(), ContainsSubstring("row 1 (id 'bad-1'): text_embedding_dtype is 'float16'"));
  }
  SECTION("clips of two shapes in one batch") {
    latent_parquet_options options = written_case("other-shape");
    options.shuffle = false;
    latent_parquet_dataset data(options);
    CHECK_THROWS_WITH(data.next(), ContainsSubstring("row 2 (id 'bad-2') has latents [4, 2, 4, 2]") &&
                                       ContainsSubstring("unlike") && ContainsSubstring("in the same batch"));
  }
}

TEST_CASE("options that cannot work are refused") {
  latent_parquet_options options = options_for(0, 12);
  CHECK_THROWS_WITH(latent_parquet_dataset(options),
                    ContainsSubstring("the train split has 11 rows for 12 data-parallel ranks"));
  options = options_for();
  options.paths = {dataset().folder.path() / "nothing-here"};
  CHECK_THROWS_WITH(latent_parquet_dataset(options), ContainsSubstring("is neither a file nor a folder"));
  options = options_for();
  options.held_out_fraction = 1.0;
  CHECK_THROWS_WITH(latent_parquet_dataset(options), ContainsSubstring("held_out_fraction is 1"));
}
