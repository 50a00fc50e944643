// loom::data::text_dataset with a tokenizer whose tokens are bytes (id = byte + 2, EOS 1), so that
// every sequence can be read back into the documents it packed: each epoch, ranks 0..W-1 together
// read every document once and no two read the same one, at 1, 2 and 3 ranks; the order changes with
// the epoch and the seed; a dataset restored from any step's state gives the uninterrupted run's
// sequences after it; and each kind of bad input gets its sentence.
#include <loom/data/read_ahead.hpp>
#include <loom/data/text_dataset.hpp>
#include <loom/data/tokenizer.hpp>

#include "byte_tokenizer.hpp"
#include "scratch_folder.hpp"

#include <nlohmann/json.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::MessageMatches;
using loom::data::text_dataset;
using loom::data::text_dataset_options;
using nlohmann::json;

namespace {

using folder = loom::testing::scratch_folder;
using loom::testing::byte_tokenizer;

// 40 documents of 3 to 60 characters in two JSON Lines files (blank lines between some) and 9 in a
// text file; document k's text starts "doc k:".
std::set<std::string> write_documents(const fs::path& dir) {
  std::set<std::string> all;
  std::ofstream a(dir / "a.jsonl"), b(dir / "b.jsonl"), c(dir / "c.txt");
  for (int k = 0; k < 49; ++k) {
    std::string text = "doc " + std::to_string(k) + ":" + std::string(static_cast<std::size_t>(3 + (k * 7) % 57), 'x');
    all.insert(text);
    if (k < 20) {
      a << json{{"text", text}, {"id", k}}.dump() << "\n" << (k % 5 == 0 ? "\n" : "");
    } else if (k < 40) {
      b << json{{"meta", {{"k", k}}}, {"text", text}}.dump() << "\r\n";
    } else {
      c << text << "\n";
    }
  }
  return all;
}

// The documents `sequences` packed, and the tokens left over.
std::vector<std::string> documents_in(const std::vector<std::vector<std::int32_t>>& sequences,
                                      const std::vector<std::int32_t>& waiting) {
  std::vector<std::string> docs;
  std::string current;
  const auto take = [&](std::int32_t id) {
    if (id == 1) {
      docs.push_back(current);
      current.clear();
    } else {
      current += static_cast<char>(id - 2);
    }
  };
  for (const auto& sequence : sequences)
    for (const std::int32_t id : sequence) take(id);
  for (const std::int32_t id : waiting) take(id);
  CHECK(current.empty());  // the state's waiting tokens end with a whole document
  return docs;
}

[[nodiscard]] std::vector<std::int32_t> waiting_of(const text_dataset& dataset) {
  return json::parse(dataset.state())["waiting"].get<std::vector<std::int32_t>>();
}

}  // namespace

TEST_CASE("each epoch the ranks read every document once between them, none twice, in a new order") {
  const folder dir;
  const std::set<std::string> all = write_documents(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const int world = GENERATE(1, 2, 3);
  CAPTURE(world);
  // A sequence length of 1 token empties the waiting tokens after every document: each rank's stream of
  // documents is whole, and an epoch ends exactly where its documents do.
  std::multiset<std::string> epoch0, epoch1;
  std::vector<std::string> order0_rank0, order1_rank0;
  for (int rank = 0; rank < world; ++rank) {
    text_dataset dataset(tokenizer,
                         {.paths = {dir.path()}, .seq_len = 1, .seed = 3, .rank = rank, .world_size = world});
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<std::vector<std::int32_t>> sequences;
      while (true) {
        sequences.push_back(dataset.next());
        if (sequences.back()[0] == 1 && waiting_of(dataset).empty()) {
          // a document ended; the epoch ends when the next read would turn it
          const json state = json::parse(dataset.state());
          const auto read = state["documents_read"].get<std::uint64_t>();
          const std::uint64_t share = 49 / world + (static_cast<std::uint64_t>(rank) < 49 % world ? 1 : 0);
          if (read == share) break;
        }
      }
      for (const std::string& d : documents_in(sequences, {})) (epoch == 0 ? epoch0 : epoch1).insert(d);
      if (rank == 0) (epoch == 0 ? order0_rank0 : order1_rank0) = documents_in(sequences, {});
    }
  }
  CHECK(epoch0 == std::multiset<std::string>(all.begin(), all.end()));
  CHECK(epoch1 == std::multiset<std::string>(all.begin(), all.end()));
  CHECK(order0_rank0 != order1_rank0);  // reshuffled by the epoch
}

TEST_CASE("the order follows the seed, and shuffle = false reads the files in order") {
  const folder dir;
  write_documents(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto first = [&](std::uint64_t seed, bool shuffle) {
    text_dataset dataset(tokenizer, {.paths = {dir.path()}, .seq_len = 64, .seed = seed, .shuffle = shuffle});
    return dataset.next();
  };
  CHECK(first(1, true) == first(1, true));
  CHECK(first(1, true) != first(2, true));
  const std::vector<std::int32_t> plain = first(1, false);
  const std::string start = "doc 0:";
  CHECK(std::equal(start.begin(), start.end(), plain.begin(), [](char c, std::int32_t id) { return c + 2 == id; }));
}

TEST_CASE("a dataset restored from the state after any sequence gives the uninterrupted run's sequences") {
  const folder dir;
  write_documents(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const int world = GENERATE(2, 3);
  const int rank = world - 1;
  const text_dataset_options options{.paths = {dir.path() / "b.jsonl", dir.path() / "a.jsonl", dir.path() / "c.txt"},
                                     .seq_len = 23,
                                     .seed = 11,
                                     .rank = rank,
                                     .world_size = world};
  text_dataset straight(tokenizer, options);
  std::vector<std::vector<std::int32_t>> expected;
  std::vector<std::string> states;
  for (int step = 0; step < 120; ++step) {  // over several epochs
    states.push_back(straight.state());
    expected.push_back(straight.next());
  }
  CHECK(straight.epoch() >= 2);
  for (const int from : {0, 1, 17, 40, 41, 77, 119}) {
    CAPTURE(world, from);
    text_dataset resumed(tokenizer, options);
    resumed.restore(states[static_cast<std::size_t>(from)]);
    for (int step = from; step < 120; ++step) REQUIRE(resumed.next() == expected[static_cast<std::size_t>(step)]);
  }
}

TEST_CASE("bad input: one sentence naming the file and line, or skipped and counted") {
  const folder dir;
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const fs::path data = dir.path() / "data.jsonl";
  {
    std::ofstream out(data);
    out << R"({"text": "fine"})"
        << "\n"
        << R"({"text": "also fine"})"
        << "\n"
        << R"({"text": broken)"
        << "\n"
        << R"({"body": "no text"})"
        << "\n"
        << R"({"text": 5})"
        << "\n";
  }
  const auto read_all = [&](bool skip) {
    text_dataset dataset(tokenizer, {.paths = {data}, .seq_len = 4, .shuffle = false, .skip_malformed = skip});
    for (int i = 0; i < 12; ++i) (void)dataset.next();
    return dataset.skipped_lines();
  };
  CHECK_THROWS_MATCHES(read_all(false), std::invalid_argument,
                       MessageMatches(ContainsSubstring("data.jsonl:3: the line is not JSON (skip_malformed skips")));
  CHECK(read_all(true) >= 3);  // lines 3, 4 and 5, each epoch
  {
    std::ofstream out(data);
    out << R"({"body": "x"})"
        << "\n";
  }
  CHECK_THROWS_MATCHES(read_all(false), std::invalid_argument,
                       MessageMatches(ContainsSubstring("data.jsonl:1: the line has no \"text\" field, only body; "
                                                        "text_field names the field to read (skip_malformed skips")));
  // A program names its own flags, and a field close to the one asked for is offered.
  {
    std::ofstream out(data);
    out << R"({"txt": "x", "meta": 1})"
        << "\n";
  }
  CHECK_THROWS_MATCHES(
      (text_dataset(tokenizer, {.paths = {data},
                                .seq_len = 4,
                                .shuffle = false,
                                .text_field_option = "--text-field",
                                .skip_malformed_option = "--skip-malformed"})
           .next()),
      std::invalid_argument,
      MessageMatches(ContainsSubstring("data.jsonl:1: the line has no \"text\" field, only meta, txt (did you mean "
                                       "\"txt\"?); --text-field names the field to read (--skip-malformed skips "
                                       "such lines, counting them)")));

  const fs::path empty = dir.path() / "empty.jsonl";
  std::ofstream(empty) << "\n  \n";
  CHECK_THROWS_MATCHES(
      text_dataset(tokenizer, {.paths = {empty}}), std::invalid_argument,
      MessageMatches(ContainsSubstring("no documents in") && ContainsSubstring("every line is empty")));
  CHECK_THROWS_MATCHES(text_dataset(tokenizer, {.paths = {dir.path() / "absent.jsonl"}}), std::invalid_argument,
                       MessageMatches(ContainsSubstring("absent.jsonl is neither a file nor a folder")));

  const fs::path small = dir.path() / "small.jsonl";
  std::ofstream(small) << R"({"text": "tiny"})"
                       << "\n";
  CHECK_THROWS_MATCHES(
      [&] {
        text_dataset dataset(tokenizer, {.paths = {small}, .seq_len = 100});
        (void)dataset.next();
      }(),
      std::invalid_argument,
      MessageMatches(ContainsSubstring("rank 0's share of the data (1 of 1 documents) does not fill one sequence of "
                                       "100 tokens")));

  const fs::path bad_utf8 = dir.path() / "bytes.txt";
  std::ofstream(bad_utf8) << "ok line\nbad \xFF line\n";
  CHECK_THROWS_MATCHES(
      [&] {
        text_dataset dataset(tokenizer, {.paths = {bad_utf8}, .seq_len = 4, .shuffle = false});
        for (int i = 0; i < 10; ++i) (void)dataset.next();
      }(),
      std::invalid_argument,
      MessageMatches(ContainsSubstring("bytes.txt:2: the text is not valid UTF-8 at byte offset 4 (byte 0xFF)")));
}

TEST_CASE("a file that vanishes or shrinks while read is named, and so is a state of other data") {
  const folder dir;
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const fs::path data = dir.path() / "data.jsonl";
  {
    std::ofstream out(data);
    for (int k = 0; k < 10; ++k) out << json{{"text", "document " + std::to_string(k)}}.dump() << "\n";
  }
  text_dataset dataset(tokenizer, {.paths = {data}, .seq_len = 8, .shuffle = false});
  (void)dataset.next();
  const std::string state = dataset.state();
  fs::resize_file(data, 30);
  CHECK_THROWS_MATCHES(
      [&] {
        for (int i = 0; i < 20; ++i) (void)dataset.next();
      }(),
      std::runtime_error,
      MessageMatches(ContainsSubstring("data.jsonl was truncated while the run read it: it has 30 bytes")));
  text_dataset other(tokenizer, {.paths = {data}, .seq_len = 8, .shuffle = false});
  CHECK_THROWS_MATCHES(
      other.restore(state), std::invalid_argument,
      MessageMatches(ContainsSubstring("the state is of another dataset: its \"documents\" is 10, this "
                                       "dataset's is 2")));
  text_dataset longer(tokenizer, {.paths = {data}, .seq_len = 9, .shuffle = false});
  fs::remove(data);
  CHECK_THROWS_MATCHES(
      [&] {
        for (int i = 0; i < 20; ++i) (void)longer.next();
      }(),
      std::runtime_error, MessageMatches(ContainsSubstring("cannot be read any more (it is gone)")));
}

TEST_CASE("read_ahead gives the dataset's sequences and states in order, and its errors where they happen") {
  const folder dir;
  write_documents(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const text_dataset_options options{.paths = {dir.path()}, .seq_len = 13, .seed = 5, .rank = 1, .world_size = 2};
  text_dataset direct(tokenizer, options);
  loom::data::read_ahead ahead(text_dataset(tokenizer, options), /*depth=*/3);
  std::vector<std::string> states;
  for (int step = 0; step < 60; ++step) {
    CAPTURE(step);
    states.push_back(direct.state());
    REQUIRE(ahead.state() == direct.state());  // the position next() left, not the reader's
    REQUIRE(ahead.next() == direct.next());
  }
  ahead.restore(states[20]);
  text_dataset again(tokenizer, options);
  again.restore(states[20]);
  for (int step = 20; step < 40; ++step) REQUIRE(ahead.next() == again.next());
  CHECK_THROWS_MATCHES(ahead.restore("{}"), std::invalid_argument,
                       MessageMatches(ContainsSubstring("not one text_dataset::state() wrote")));
  CHECK(ahead.next() == again.next());  // a refused state leaves the reading where it was

  const fs::path bad = dir.path() / "bad" / "data.jsonl";
  fs::create_directories(bad.parent_path());
  {
    std::ofstream out(bad);
    for (int k = 0; k < 6; ++k) out << json{{"text", "fine document " + std::to_string(k)}}.dump() << "\n";
    out << "{not json\n";
  }
  loom::data::read_ahead failing(text_dataset(tokenizer, {.paths = {bad}, .seq_len = 8, .shuffle = false}));
  int delivered = 0;
  CHECK_THROWS_MATCHES(
      [&] {
        for (;; ++delivered) (void)failing.next();
      }(),
      std::invalid_argument, MessageMatches(ContainsSubstring("data.jsonl:7: the line is not JSON")));
  CHECK(delivered == 12);  // the 6 documents' 96 tokens (15 bytes and EOS each) fill 12 before line 7 is read
  CHECK_THROWS_AS(failing.next(), std::invalid_argument);
}

namespace {

// An llm.c token file (uint16): each document's tokens after an EOS, as llm.c's data scripts write them.
void write_token_file(const fs::path& path, const std::vector<std::string>& documents, std::int32_t extra_id = -1) {
  std::vector<std::uint16_t> tokens;
  for (const std::string& d : documents) {
    tokens.push_back(1);
    for (const char c : d) tokens.push_back(static_cast<std::uint16_t>(static_cast<unsigned char>(c) + 2));
  }
  if (extra_id >= 0) tokens.push_back(static_cast<std::uint16_t>(extra_id));
  std::vector<std::int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<std::int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size() * 4));
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
}

}  // namespace

TEST_CASE("llm.c token files are documents too: split at EOS, shared out by rank, checked against the vocabulary") {
  const folder dir;
  const std::set<std::string> texts = write_documents(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const std::vector<std::string> tokenized{"tokens one", "tokens two, longer", "t3"};
  write_token_file(dir.path() / "d.bin", tokenized);
  std::multiset<std::string> expected(texts.begin(), texts.end());
  expected.insert(tokenized.begin(), tokenized.end());
  const int world = GENERATE(1, 2, 3);
  CAPTURE(world);
  std::multiset<std::string> seen;
  for (int rank = 0; rank < world; ++rank) {
    text_dataset dataset(tokenizer,
                         {.paths = {dir.path()}, .seq_len = 1, .seed = 9, .rank = rank, .world_size = world});
    CHECK(dataset.documents() == 52);
    const std::uint64_t share = 52 / world + (static_cast<std::uint64_t>(rank) < 52 % world ? 1 : 0);
    std::vector<std::vector<std::int32_t>> sequences;
    while (true) {
      sequences.push_back(dataset.next());
      if (sequences.back()[0] == 1 && waiting_of(dataset).empty() &&
          json::parse(dataset.state())["documents_read"].get<std::uint64_t>() == share)
        break;
    }
    for (const std::string& d : documents_in(sequences, {})) seen.insert(d);
  }
  CHECK(seen == expected);

  write_token_file(dir.path() / "d.bin", tokenized, /*extra_id=*/400);
  CHECK_THROWS_MATCHES(
      [&] {
        text_dataset dataset(tokenizer, {.paths = {dir.path() / "d.bin"}, .seq_len = 4, .shuffle = false});
        for (int i = 0; i < 20; ++i) (void)dataset.next();
      }(),
      std::invalid_argument,
      MessageMatches(ContainsSubstring("d.bin: token 33 is id 400, not below the tokenizer's vocabulary of 258")));
  fs::resize_file(dir.path() / "d.bin", 1024 + 10);
  CHECK_THROWS_MATCHES(
      text_dataset(tokenizer, {.paths = {dir.path() / "d.bin"}}), std::invalid_argument,
      MessageMatches(ContainsSubstring("d.bin's header counts 34 tokens of 2 bytes, 1092 bytes in all, "
                                       "but the file has 1034: it is truncated")));
  std::ofstream(dir.path() / "d.bin") << "not a token file";
  CHECK_THROWS_MATCHES(text_dataset(tokenizer, {.paths = {dir.path() / "d.bin"}}), std::invalid_argument,
                       MessageMatches(ContainsSubstring("d.bin has no llm.c header (a first int32 of 20240520")));
}
