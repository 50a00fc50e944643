// loom::data::chat_dataset over a tokenizer of bytes (id = byte + 2, EOS 1) and ChatML, so that every
// sequence reads back into the records it packed: each epoch, ranks 0..W-1 together read every record
// once and no two read the same one, at 1, 2 and 3 ranks, in an order the seed and the epoch draw; a
// sequence is seq_len tokens whose examples count their positions from 0, labelled on the assistant's
// bytes only; first-fit decreasing fills sequences at least as well as greedy; a dataset restored from
// any sequence's state gives the uninterrupted run's sequences after it (mid-window, across epochs, with
// skipped records); ShareGPT's and TRL's shapes; and each refusal's sentence.
#include <loom/data/chat_dataset.hpp>
#include <loom/data/read_ahead.hpp>

#include "byte_tokenizer.hpp"
#include "scratch_folder.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::MessageMatches;
using loom::data::chat_dataset;
using loom::data::chat_dataset_options;
using loom::data::packed_sequence;
using loom::data::packing_strategy;
using nlohmann::json;

namespace {

using folder = loom::testing::scratch_folder;
using loom::testing::byte_tokenizer;

// ChatML, as Qwen2.5 writes it: the assistant's part is found by rendering prefixes.
constexpr const char* chatml =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

// Record k's conversation: its number in the question, an answer of 1 to 150 characters.
std::string question(int k) { return fmt::format("q{}?", k); }
std::string answer(int k) {
  return fmt::format("A{}:{}", k, std::string(static_cast<std::size_t>(1 + (k * 37) % 150), 'x'));
}

json openai_record(int k) {
  return {{"messages",
           {{{"role", "system"}, {"content", "Be brief."}},
            {{"role", "user"}, {"content", question(k)}},
            {{"role", "assistant"}, {"content", answer(k)}}}}};
}

// 60 records: 0-34 in a.jsonl (blank lines between some), 35-59 in b.json (CRLF).
std::set<int> write_records(const fs::path& dir) {
  std::set<int> all;
  std::ofstream a(dir / "a.jsonl"), b(dir / "b.json");
  for (int k = 0; k < 60; ++k) {
    all.insert(k);
    if (k < 35) {
      a << openai_record(k).dump() << "\n" << (k % 6 == 0 ? "\n" : "");
    } else {
      b << openai_record(k).dump() << "\r\n";
    }
  }
  return all;
}

// One example of a sequence read back: its text, the text its labels carry, where it starts.
struct read_example {
  std::string text;
  std::string labelled;
};

std::string byte_of(std::int32_t id) {
  return id == 1 ? std::string("</s>") : std::string(1, static_cast<char>(id - 2));
}

// The examples of `sequence`, each where its positions start again at 0, checked as they are read: the
// sequence is seq_len long, a label is its token or -100, positions count up from 0 in each example and
// in the padding, which is EOS without labels.
std::vector<read_example> examples_in(const packed_sequence& sequence, std::int64_t seq_len) {
  const auto length = static_cast<std::size_t>(seq_len);
  REQUIRE(sequence.ids.size() == length);
  REQUIRE(sequence.labels.size() == length);
  REQUIRE(sequence.positions.size() == length);
  REQUIRE(sequence.tokens >= 0);
  REQUIRE(sequence.tokens <= seq_len);
  const auto used = static_cast<std::size_t>(sequence.tokens);
  std::vector<read_example> found;
  for (std::size_t t = 0; t < used; ++t) {
    if (sequence.positions[t] == 0) found.emplace_back();
    REQUIRE(!found.empty());
    if (t > 0 && sequence.positions[t] != 0) REQUIRE(sequence.positions[t] == sequence.positions[t - 1] + 1);
    found.back().text += byte_of(sequence.ids[t]);
    if (sequence.labels[t] != -100) {
      REQUIRE(sequence.labels[t] == sequence.ids[t]);
      found.back().labelled += byte_of(sequence.ids[t]);
    }
  }
  for (std::size_t t = used; t < length; ++t) {
    REQUIRE(sequence.ids[t] == 1);
    REQUIRE(sequence.labels[t] == -100);
    REQUIRE(sequence.positions[t] == static_cast<std::int32_t>(t - used));
  }
  return found;
}

// The record an example was made of, by the number in its question.
int record_of(const read_example& e) {
  const std::size_t at = e.text.find("user\nq");
  REQUIRE(at != std::string::npos);
  return std::stoi(e.text.substr(at + 6));
}

// Every record of one epoch of `dataset`, in the order its sequences hold them, each example checked
// against its record: the whole rendered conversation, the loss on the answer and its end of turn.
std::vector<int> one_epoch(chat_dataset& dataset, std::int64_t seq_len, std::int64_t* sequences = nullptr) {
  std::vector<int> records;
  const std::int64_t epoch = dataset.epoch();
  std::int64_t count = 0;
  while (dataset.epoch() == epoch) {
    const packed_sequence sequence = dataset.next();
    ++count;
    for (const read_example& e : examples_in(sequence, seq_len)) {
      const int k = record_of(e);
      CHECK(e.text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + question(k) +
                          "<|im_end|>\n<|im_start|>assistant\n" + answer(k) + "<|im_end|>\n");
      CHECK(e.labelled == answer(k) + "<|im_end|>\n");
      records.push_back(k);
    }
  }
  if (sequences != nullptr) *sequences = count;
  return records;
}

loom::data::chat_template chatml_template() { return loom::data::chat_template::from_text(chatml); }

}  // namespace

TEST_CASE("each epoch the ranks read every record once between them, none twice, in a new order", "[chat-dataset]") {
  const folder dir;
  const std::set<int> all = write_records(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = chatml_template();
  const int world = GENERATE(1, 2, 3);
  const auto strategy = GENERATE(packing_strategy::first_fit_decreasing, packing_strategy::greedy);
  const bool pack = GENERATE(true, false);
  CAPTURE(world, loom::data::name_of(strategy), pack);
  std::multiset<int> epoch0, epoch1;
  std::vector<int> order0_rank0, order1_rank0;
  for (int rank = 0; rank < world; ++rank) {
    chat_dataset dataset(chat, tokenizer,
                         {.paths = {dir.path()},
                          .seq_len = 300,
                          .pack = pack,
                          .packing = strategy,
                          .pack_window = 9,
                          .seed = 3,
                          .rank = rank,
                          .world_size = world});
    CHECK(dataset.records() == 60);
    const std::vector<int> first = one_epoch(dataset, 300);
    const std::vector<int> second = one_epoch(dataset, 300);
    CHECK(first.size() == static_cast<std::size_t>(60 / world));
    epoch0.insert(first.begin(), first.end());
    epoch1.insert(second.begin(), second.end());
    if (rank == 0) {
      order0_rank0 = first;
      order1_rank0 = second;
    }
  }
  CHECK(epoch0 == std::multiset<int>(all.begin(), all.end()));
  CHECK(epoch1 == std::multiset<int>(all.begin(), all.end()));
  CHECK(order0_rank0 != order1_rank0);  // reshuffled by the epoch
}

TEST_CASE("the order follows the seed, and shuffle = false reads the files in order", "[chat-dataset]") {
  const folder dir;
  write_records(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = chatml_template();
  const auto records = [&](std::uint64_t seed, bool shuffle) {
    chat_dataset dataset(chat, tokenizer,
                         {.paths = {dir.path()}, .seq_len = 300, .pack = false, .seed = seed, .shuffle = shuffle});
    return one_epoch(dataset, 300);
  };
  CHECK(records(1, true) == records(1, true));
  CHECK(records(1, true) != records(2, true));
  std::vector<int> in_order(60);
  for (int k = 0; k < 60; ++k) in_order[static_cast<std::size_t>(k)] = k;
  CHECK(records(1, false) == in_order);
}

TEST_CASE(
    "packing: one example a sequence unpacked, first-fit decreasing at least as full as greedy, the summary "
    "what an epoch gives",
    "[chat-dataset]") {
  const folder dir;
  write_records(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = chatml_template();
  const chat_dataset_options base{.paths = {dir.path()}, .seq_len = 400, .pack_window = 20, .seed = 5};
  std::map<std::string, loom::data::chat_data_summary> summaries;
  for (const auto& [name, pack, strategy] :
       {std::tuple{"first_fit_decreasing", true, packing_strategy::first_fit_decreasing},
        std::tuple{"greedy", true, packing_strategy::greedy},
        std::tuple{"unpacked", false, packing_strategy::greedy}}) {
    CAPTURE(name);
    chat_dataset_options options = base;
    options.pack = pack;
    options.packing = strategy;
    chat_dataset dataset(chat, tokenizer, options);
    chat_dataset without_summary(chat, tokenizer, options);
    (void)dataset.next();
    (void)without_summary.next();
    const std::string before = dataset.state();
    const loom::data::chat_data_summary summary = dataset.summary();
    CHECK(dataset.state() == before);  // summary() reads on its own, leaving the position as it was
    dataset.restore(chat_dataset(chat, tokenizer, options).state());
    without_summary.restore(dataset.state());
    // What one epoch of next() gives, counted by hand.
    std::int64_t sequences = 0, tokens = 0, loss_tokens = 0, examples = 0;
    while (dataset.epoch() == 0) {
      const packed_sequence sequence = dataset.next();
      REQUIRE(sequence.ids == without_summary.next().ids);
      const std::vector<read_example> held = examples_in(sequence, 400);
      if (!pack) CHECK(held.size() == 1);
      ++sequences;
      examples += static_cast<std::int64_t>(held.size());
      tokens += sequence.tokens;
      loss_tokens += std::count_if(sequence.labels.begin(), sequence.labels.end(), [](auto l) { return l != -100; });
    }
    CHECK(summary.examples == 60);
    CHECK(summary.examples == examples);
    CHECK(summary.sequences == sequences);
    CHECK(summary.tokens == tokens);
    CHECK(summary.loss_tokens == loss_tokens);
    CHECK(summary.padding_tokens == sequences * 400 - tokens);
    CHECK(summary.truncated == 0);
    CHECK(summary.skipped == 0);
    CHECK(summary.packing_efficiency() == static_cast<double>(tokens) / static_cast<double>(sequences * 400));
    CHECK(summary.loss_share() > 0.1);
    CHECK(summary.loss_share() < 0.9);
    summaries[name] = summary;
  }
  CHECK(summaries["unpacked"].sequences == 60);
  CHECK(summaries["first_fit_decreasing"].tokens == summaries["unpacked"].tokens);
  CHECK(summaries["greedy"].tokens == summaries["unpacked"].tokens);
  CHECK(summaries["first_fit_decreasing"].packing_efficiency() >= summaries["greedy"].packing_efficiency());
  CHECK(summaries["greedy"].packing_efficiency() > 1.5 * summaries["unpacked"].packing_efficiency());
}

namespace {

// write_records' 60 records with malformed lines among them: not JSON, no messages, a role the fields
// do not map.
void write_records_with_bad_ones(const fs::path& dir) {
  write_records(dir);
  std::ofstream c(dir / "c.jsonl");
  c << R"({"messages": broken)"
    << "\n"
    << openai_record(60).dump() << "\n"
    << R"({"text": "no messages"})"
    << "\n"
    << R"({"messages": [{"role": "narrator", "content": "x"}]})"
    << "\n"
    << openai_record(61).dump() << "\n";
}

}  // namespace

TEST_CASE("a dataset restored from the state after any sequence gives the uninterrupted run's sequences",
          "[chat-dataset]") {
  const folder dir;
  write_records_with_bad_ones(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = chatml_template();
  const int world = GENERATE(1, 2, 3);
  const auto strategy = GENERATE(packing_strategy::first_fit_decreasing, packing_strategy::greedy);
  const bool pack = GENERATE(true, false);
  const int rank = world - 1;
  const chat_dataset_options options{.paths = {dir.path() / "c.jsonl", dir.path() / "b.json", dir.path() / "a.jsonl"},
                                     .seq_len = 512,
                                     .pack = pack,
                                     .packing = strategy,
                                     .pack_window = 7,
                                     .seed = 11,
                                     .skip_malformed = true,
                                     .rank = rank,
                                     .world_size = world};
  CAPTURE(world, loom::data::name_of(strategy), pack);
  chat_dataset straight(chat, tokenizer, options);
  std::vector<packed_sequence> expected;
  std::vector<std::string> states;
  std::vector<std::int64_t> skipped;
  while (straight.epoch() < 3) {
    states.push_back(straight.state());
    expected.push_back(straight.next());
    skipped.push_back(straight.skipped_records());
  }
  const std::size_t steps = expected.size();
  if (world == 1) CHECK(straight.skipped_records() == 3 * 3);  // the 3 bad records, each epoch
  // The points to resume from: the start, each epoch's first sequence and the one before it, the
  // middle of a window (first-fit decreasing gives a window several sequences), and the last.
  std::set<std::size_t> from{0, 1, steps / 2, steps - 1};
  bool mid_window = false;
  for (std::size_t step = 1; step < steps; ++step) {
    const json state = json::parse(states[step]);
    if (state["epoch"] != json::parse(states[step - 1])["epoch"]) {
      from.insert(step - 1);
      from.insert(step);
    }
    if (state["sequence_in_window"].get<int>() > 0 && !mid_window) {
      from.insert(step);
      mid_window = true;
    }
  }
  if (pack && strategy == packing_strategy::first_fit_decreasing) CHECK(mid_window);
  for (const std::size_t start : from) {
    CAPTURE(start);
    chat_dataset resumed(chat, tokenizer, options);
    resumed.restore(states[start]);
    for (std::size_t step = start; step < steps; ++step) {
      const packed_sequence sequence = resumed.next();
      REQUIRE(sequence.ids == expected[step].ids);
      REQUIRE(sequence.labels == expected[step].labels);
      REQUIRE(sequence.positions == expected[step].positions);
      REQUIRE(sequence.tokens == expected[step].tokens);
      REQUIRE(resumed.skipped_records() == skipped[step]);
    }
  }
}

TEST_CASE("a state of other files, options or ranks is refused, naming what differs", "[chat-dataset]") {
  const folder dir;
  write_records(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = chatml_template();
  const chat_dataset_options options{.paths = {dir.path()}, .seq_len = 512, .seed = 2, .rank = 0, .world_size = 2};
  chat_dataset dataset(chat, tokenizer, options);
  (void)dataset.next();
  const std::string state = dataset.state();
  const auto refused = [&](chat_dataset_options other, const std::string& sentence) {
    chat_dataset elsewhere(chat, tokenizer, std::move(other));
    CHECK_THROWS_MATCHES(elsewhere.restore(state), std::invalid_argument, MessageMatches(ContainsSubstring(sentence)));
  };
  chat_dataset_options other = options;
  other.rank = 1;
  refused(other,
          "the state is of another dataset: its \"rank\" is 0, this dataset's is 1: restore it with the files, "
          "options and ranks it was saved with");
  other = options;
  other.seq_len = 256;
  refused(other, "its \"seq_len\" is 512, this dataset's is 256");
  other = options;
  other.packing = packing_strategy::greedy;
  refused(other, "its \"packing\" is \"first_fit_decreasing\", this dataset's is \"greedy\"");
  other = options;
  other.fields = loom::data::chat_fields::sharegpt();
  refused(other, "its \"fields\" is");
  other = options;
  other.render.variables["enable_thinking"] = false;
  refused(other, "its \"render\" is");
  other = options;
  other.paths = {dir.path() / "a.jsonl"};
  refused(other, "its \"files\" is");
  // Another template: its text's digest differs.
  const auto other_template =
      loom::data::chat_template::from_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}");
  chat_dataset templated(other_template, tokenizer, options);
  CHECK_THROWS_MATCHES(templated.restore(state), std::invalid_argument,
                       MessageMatches(ContainsSubstring("its \"template\" is")));
  CHECK_THROWS_MATCHES(dataset.restore("{}"), std::invalid_argument,
                       MessageMatches(ContainsSubstring("not one chat_dataset::state() wrote")));
  json damaged = json::parse(state);
  damaged["records_read"] = 1000;
  CHECK_THROWS_MATCHES(dataset.restore(damaged.dump()), std::invalid_argument,
                       MessageMatches(ContainsSubstring("damaged: its position is past the data")));
  // A refused state leaves the dataset where it was.
  chat_dataset again(chat, tokenizer, options);
  again.restore(state);
  CHECK(dataset.next().ids == again.next().ids);
}

TEST_CASE("bad records: one sentence naming the file and line, or skipped and counted", "[chat-dataset]") {
  const folder dir;
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = loom::data::chat_template::from_text(
      "{% for m in messages %}{% if m.content == 'boom' %}{{ raise_exception('no booms here') }}{% endif %}"
      "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}");
  const fs::path data = dir.path() / "data.jsonl";
  const auto write = [&](const std::vector<std::string>& lines) {
    std::ofstream out(data);
    for (const std::string& line : lines) out << line << "\n";
  };
  const std::string good = openai_record(1).dump();
  const auto read_all = [&](bool skip, chat_dataset_options options = {}) {
    options.paths = {data};
    options.seq_len = 128;
    options.shuffle = false;
    options.skip_malformed = skip;
    chat_dataset dataset(chat, tokenizer, options);
    for (int i = 0; i < 6; ++i) (void)dataset.next();
    return dataset.skipped_records();
  };
  const auto refused = [&](const std::vector<std::string>& lines, const std::string& sentence) {
    write(lines);
    CHECK_THROWS_MATCHES(read_all(false), std::invalid_argument, MessageMatches(ContainsSubstring(sentence)));
  };
  refused(
      {good, R"({"messages": broken)"},
      "chat_dataset: " + data.string() + ":2: the line is not JSON (skip_malformed skips such records, counting them)");
  refused({good, "[1, 2]"}, "data.jsonl:2: the line is JSON but not an object of fields");
  refused({good, good, R"({"conversation": [], "id": 3})"},
          "data.jsonl:3: the record has neither 'messages' nor both 'prompt' and 'completion', only conversation, id; "
          "fields names the record's fields (skip_malformed skips");
  refused({R"({"messages": [{"role": "narrator", "content": "x"}]})"},
          "data.jsonl:1: its 'messages' message 0 has the role 'narrator', which is none of");
  refused({good, R"({"messages": [{"role": "user", "content": "boom"}]})"},
          "data.jsonl:2: the chat template fails on the record: ");
  refused({good, R"({"messages": [{"role": "user", "content": "boom"}]})"}, "no booms here");
  refused({good, R"({"prompt": "bad \ud800 text", "completion": "x"})"}, "data.jsonl:2: the line is not JSON");

  // Skipped instead, and counted: 3 bad records of 5, each epoch (6 sequences are 3 epochs of 2).
  write({good, R"({"messages": broken)", "{\"text\": 1}", good,
         R"({"messages": [{"role": "user", "content": "boom"}]})"});
  CHECK(read_all(true, {.pack = false}) == 9);
  // A program names its own flags.
  write({R"({"text": 1})"});
  CHECK_THROWS_MATCHES(read_all(false, {.fields_option = "--chat-fields", .skip_malformed_option = "--skip-malformed"}),
                       std::invalid_argument,
                       MessageMatches(ContainsSubstring("only text; --chat-fields names the record's fields "
                                                        "(--skip-malformed skips such records, counting them)")));
  // Every record skipped: the epoch has nothing to give.
  CHECK_THROWS_MATCHES(read_all(true), std::invalid_argument,
                       MessageMatches(ContainsSubstring("none of rank 0's 1 record (of 1) made an example in epoch 0: "
                                                        "each was skipped as malformed (1 skipped so far)")));
}

TEST_CASE("options and data that cannot work are refused in one sentence", "[chat-dataset]") {
  const folder dir;
  write_records(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = chatml_template();
  const auto refused = [&](chat_dataset_options options, const std::string& sentence) {
    CHECK_THROWS_MATCHES(chat_dataset(chat, tokenizer, std::move(options)), std::invalid_argument,
                         MessageMatches(ContainsSubstring(sentence)));
  };
  refused({.paths = {dir.path()}, .seq_len = 0}, "chat_dataset: seq_len is 0; give at least 1");
  refused({.paths = {dir.path()}, .pack_window = 0}, "chat_dataset: pack_window is 0; give at least 1");
  refused({.paths = {dir.path()}, .rank = 2, .world_size = 2}, "rank 2 of 2 data-parallel ranks");
  refused({.paths = {dir.path()}, .pad_id = 300}, "pad_id 300 is not a token of the tokenizer's 258");
  refused({}, "no paths given");
  refused({.paths = {dir.path() / "absent.jsonl"}}, "absent.jsonl is neither a file nor a folder");
  fs::create_directories(dir.path() / "empty");
  refused({.paths = {dir.path() / "empty"}},
          "the folder " + (dir.path() / "empty").string() + " has no .jsonl or .json files");
  std::ofstream(dir.path() / "empty" / "blank.jsonl") << "\n  \n";
  refused({.paths = {dir.path() / "empty"}},
          "no records in " + (dir.path() / "empty" / "blank.jsonl").string() + ": every line is empty");
  std::ofstream(dir.path() / "empty" / "one.jsonl") << openai_record(0).dump() << "\n";
  refused({.paths = {dir.path() / "empty"}, .rank = 0, .world_size = 2},
          "1 record for 2 data-parallel ranks: each rank needs one at least");

  // A tokenizer without an EOS pads with what pad_id names, or is refused.
  json vocab = {{"<unk>", 0}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = b + 1;
  fs::create_directories(dir.path() / "no_eos");
  std::ofstream(dir.path() / "no_eos" / "tokenizer.json")
      << json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"byte_fallback", true}}}}
             .dump();
  const auto no_eos = loom::data::tokenizer::from_pretrained(dir.path() / "no_eos");
  CHECK_THROWS_MATCHES(chat_dataset(chat, no_eos, {.paths = {dir.path()}}), std::invalid_argument,
                       MessageMatches(ContainsSubstring("the tokenizer has no EOS token to pad sequences with") &&
                                      ContainsSubstring("give pad_id")));
  chat_dataset padded(chat, no_eos, {.paths = {dir.path()}, .seq_len = 400, .pad_id = 0});
  const packed_sequence sequence = padded.next();
  REQUIRE(sequence.tokens < 400);
  CHECK(sequence.ids.back() == 0);
}

TEST_CASE("ShareGPT's conversations, TRL's prompt and completion, and examples longer than a sequence",
          "[chat-dataset]") {
  const folder dir;
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = chatml_template();
  {
    std::ofstream out(dir.path() / "sharegpt.jsonl");
    out << R"({"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]})"
        << "\n"
        << R"({"conversations": [{"from": "system", "value": "Terse."}, {"from": "human", "value": "Hi"},)"
        << R"( {"from": "gpt", "value": "Hello"}, {"from": "human", "value": "Bye"}, {"from": "gpt", "value": "Ciao"}]})"
        << "\n";
  }
  chat_dataset sharegpt(chat, tokenizer,
                        {.paths = {dir.path() / "sharegpt.jsonl"},
                         .fields = loom::data::chat_fields::sharegpt(),
                         .seq_len = 256,
                         .shuffle = false});
  const std::vector<read_example> shared = examples_in(sharegpt.next(), 256);
  REQUIRE(shared.size() == 2);
  // First-fit decreasing lays the longer conversation out first.
  CHECK(shared[0].text ==
        "<|im_start|>system\nTerse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\nCiao<|im_end|>\n");
  CHECK(shared[0].labelled == "Hello<|im_end|>\nCiao<|im_end|>\n");
  CHECK(shared[1].labelled == "4<|im_end|>\n");

  {
    std::ofstream out(dir.path() / "completions.jsonl");
    out << R"({"prompt": "The sky is", "completion": " blue."})"
        << "\n"
        << R"({"prompt": [{"role": "user", "content": "Name a colour"}], "completion": [{"role": "assistant", "content": "Red"}]})"
        << "\n"
        << json{{"prompt", "Count:"}, {"completion", std::string(300, '1')}}.dump() << "\n";
  }
  chat_dataset completions(
      chat, tokenizer, {.paths = {dir.path() / "completions.jsonl"}, .seq_len = 128, .pack = false, .shuffle = false});
  CHECK(examples_in(completions.next(), 128).at(0).labelled == " blue.</s>");
  CHECK(examples_in(completions.next(), 128).at(0).labelled == "Red<|im_end|>\n");
  // Longer than the sequence: cut to it.
  const packed_sequence cut = completions.next();
  CHECK(cut.tokens == 128);
  CHECK(examples_in(cut, 128).at(0).labelled == std::string(128 - 6, '1'));
  const loom::data::chat_data_summary summary = completions.summary();
  CHECK(summary.examples == 3);
  CHECK(summary.truncated == 1);
  CHECK(summary.sequences == 3);
  // "The sky is blue." and its EOS; the two ChatML turns; the cut one.
  CHECK(summary.tokens == 17 + 41 + 36 + 128);
  CHECK(summary.loss_tokens == 7 + 14 + 122);
}

TEST_CASE("a record whose loss lies past seq_len is left out and counted: it would teach nothing", "[chat-dataset]") {
  const folder dir;
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = chatml_template();
  {
    std::ofstream out(dir.path() / "long-prompts.jsonl");
    for (const int length : {200, 20, 300, 30}) {
      const json messages = json::array(
          {{{"role", "user"}, {"content", std::string(length, 'q')}}, {{"role", "assistant"}, {"content", "A"}}});
      out << json{{"messages", messages}}.dump() << "\n";
    }
  }
  for (const bool pack : {true, false}) {
    CAPTURE(pack);
    chat_dataset dataset(
        chat, tokenizer,
        {.paths = {dir.path() / "long-prompts.jsonl"}, .seq_len = 128, .pack = pack, .shuffle = false});
    const loom::data::chat_data_summary summary = dataset.summary();
    CHECK(summary.without_loss == 2);
    CHECK(summary.examples == 2);
    CHECK(summary.truncated == 0);
    // Every sequence of an epoch carries loss: none is made of cut prompts alone.
    for (std::int64_t k = 0; k < summary.sequences; ++k) {
      const packed_sequence sequence = dataset.next();
      CHECK(std::count_if(sequence.labels.begin(), sequence.labels.end(), [](auto l) { return l != -100; }) > 0);
    }
    CHECK(dataset.epoch() == 1);
  }
}

TEST_CASE("identity: the files' names, sizes and digest, the same on every rank", "[chat-dataset]") {
  const folder dir;
  write_records(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = chatml_template();
  const auto identity = [&](int rank) {
    return chat_dataset(chat, tokenizer, {.paths = {dir.path()}, .rank = rank, .world_size = 2}).identity();
  };
  const std::string first = identity(0);
  CHECK(first == identity(1));
  const std::uintmax_t bytes = fs::file_size(dir.path() / "a.jsonl") + fs::file_size(dir.path() / "b.json");
  CHECK_THAT(first, ContainsSubstring("a.jsonl, b.json (2 files, " + std::to_string(bytes) + " bytes, digest "));
  // The same sizes, other bytes: another identity.
  std::string text;
  {
    std::ifstream in(dir.path() / "a.jsonl");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  text[text.find("q1?")] = 'Q';
  std::ofstream(dir.path() / "a.jsonl") << text;
  CHECK(identity(0) != first);
}

TEST_CASE("the loss on every token, and the render's options passed to the template", "[chat-dataset]") {
  const folder dir;
  write_records(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = loom::data::chat_template::from_text(
      "{{ preamble }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}");
  chat_dataset_options options{.paths = {dir.path()}, .loss = loom::data::loss_on::every_token, .seq_len = 512};
  options.render.variables["preamble"] = "[P]";
  chat_dataset dataset(chat, tokenizer, options);
  for (int i = 0; i < 5; ++i) {
    for (const read_example& e : examples_in(dataset.next(), 512)) {
      CHECK(e.text.starts_with("[P]<|im_start|>system\n"));
      CHECK(e.labelled == e.text);
    }
  }
}

TEST_CASE("a file that vanishes or shrinks while read is named", "[chat-dataset]") {
  const folder dir;
  write_records(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = chatml_template();
  const fs::path data = dir.path() / "a.jsonl";
  chat_dataset dataset(chat, tokenizer, {.paths = {data}, .seq_len = 512, .pack_window = 4, .shuffle = false});
  (void)dataset.next();
  fs::resize_file(data, 300);
  CHECK_THROWS_MATCHES(
      [&] {
        for (int i = 0; i < 40; ++i) (void)dataset.next();
      }(),
      std::runtime_error,
      MessageMatches(ContainsSubstring("a.jsonl was truncated while the run read it: it has 300 bytes")));
  chat_dataset other(chat, tokenizer, {.paths = {dir.path() / "b.json"}, .seq_len = 512, .shuffle = false});
  fs::remove(dir.path() / "b.json");
  CHECK_THROWS_MATCHES(other.next(), std::runtime_error,
                       MessageMatches(ContainsSubstring("cannot be read any more (it is gone)")));
}

TEST_CASE("read ahead on a thread, a chat dataset gives its sequences and positions in order", "[chat-dataset]") {
  const folder dir;
  write_records(dir.path());
  const auto tokenizer = byte_tokenizer(dir.path() / "tokenizer");
  const auto chat = chatml_template();
  const chat_dataset_options options{.paths = {dir.path()}, .seq_len = 256, .pack_window = 16, .seed = 3};
  chat_dataset direct(chat, tokenizer, options);
  loom::data::basic_read_ahead<chat_dataset> ahead(chat_dataset(chat, tokenizer, options), /*depth=*/3);
  std::string after_five;
  for (int n = 0; n < 40; ++n) {
    const packed_sequence expected = direct.next();
    const packed_sequence read = ahead.next();
    REQUIRE(read.ids == expected.ids);
    CHECK(read.labels == expected.labels);
    CHECK(read.positions == expected.positions);
    CHECK(ahead.state() == direct.state());  // after the sequence taken, not after those read ahead
    if (n == 4) after_five = ahead.state();
  }
  CHECK(ahead.identity() == direct.identity());
  ahead.restore(after_five);
  direct.restore(after_five);
  CHECK(ahead.next().ids == direct.next().ids);
  CHECK_THROWS_WITH(ahead.restore("{}"), ContainsSubstring("not one chat_dataset::state() wrote"));
  CHECK(ahead.next().ids == direct.next().ids);  // a state refused leaves the reading where it was
}
