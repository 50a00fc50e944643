// Training tokens per second with packing against padding to the longest example, on the same
// instruction-tuning records (docs/benchmarks.md, "Chat data: packing against padding to the longest
// example"):
//
//   build/bench/chat-packing --repetitions 5 --unmasked
//
// writes --records chat records (OpenAI's messages: a system prompt, a question, an answer) of words
// drawn at random, their counts log-normal (most records short, a few long), into a JSON Lines file,
// and renders them with a real chat template (Qwen2.5's, tests/data/chat_templates) and a tokenizer of
// bytes (id = byte + 2, as the tests' byte_tokenizer). A small random Llama (fp32, CPU, one rank) then
// trains on them in two arms (three with --unmasked), each step forward, backward and AdamW:
//
//   packed  chat_dataset with pack = true (first-fit decreasing, every record in one window): --batch
//           sequences of --seq-len tokens a step, forward(ids, labels, positions), each example
//           attending within itself;
//   padded  chat_dataset with pack = false (one example a sequence): --batch examples a step in the
//           records' shuffled order, cut to the longest of them (the columns that are padding in every
//           row dropped, as transformers' DataCollatorWithPadding pads), forward(ids, labels);
//   packed, no mask (--unmasked)  the packed batches through forward(ids, labels): the examples of a row
//           see each other, as EOS-joined packing lets them; not a way to train on chat data, but what
//           the packed arm would cost without its mask.
//
// Both arms' batches are made before any timing, from one epoch of the same records, so that each arm's
// timed pass covers exactly the same examples; a repetition times a pass of each arm, the arms
// alternating, after --warmup untimed steps of each. A pass's rate is its examples' tokens (padding
// left out) over its wall time. Printed: each arm's token positions computed, padding share and median
// rate, and the ratio of its median to the padded arm's, with the range of the repetitions' own ratios.
#include "byte_tokenizer.hpp"
#include "statistics.hpp"

#include <loom/data/chat_dataset.hpp>
#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/optim/adamw.hpp>

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace fs = std::filesystem;

#ifndef LOOM_CHAT_TEMPLATE
#define LOOM_CHAT_TEMPLATE "tests/data/chat_templates/qwen2.5.jinja"
#endif

namespace {

struct options {
  std::string chat_template = LOOM_CHAT_TEMPLATE;
  std::int64_t records = 128;
  double question_words = 8;  // the median; log-normal
  double question_sigma = 0.8;
  double answer_words = 15;
  double answer_sigma = 1.0;
  std::int64_t seq_len = 1024;
  std::int64_t batch = 4;
  std::int64_t hidden = 256;
  std::int64_t layers = 4;
  std::int64_t heads = 4;
  std::int64_t intermediate = 688;
  int repetitions = 5;
  int warmup = 2;
  int threads = 1;
  bool unmasked = false;
  std::uint64_t seed = 0;
  std::string folder;
};

// One step's tensors: int64 [rows, width] each (positions only in the packed arm).
struct batch {
  at::Tensor ids, labels, positions;
  std::int64_t tokens = 0;  // the examples' tokens, padding left out
};

// An arm's batches over one epoch of the records.
struct arm {
  std::string name;
  std::vector<batch> batches;
  bool masked = false;  // forward(ids, labels, positions): each example attending within itself
  std::int64_t examples = 0;
  std::int64_t tokens = 0;
  std::int64_t computed = 0;    // rows * width summed over the batches: the tokens the model runs over
  std::vector<double> lengths;  // each example's tokens (the padded arm's)
  [[nodiscard]] double padding_share() const {
    return 1.0 - static_cast<double>(tokens) / static_cast<double>(computed);
  }
};

// A word of 2 to 9 lower-case letters.
std::string word(std::mt19937_64& random) {
  std::uniform_int_distribution<int> length(2, 9), letter('a', 'z');
  std::string w(static_cast<std::size_t>(length(random)), ' ');
  for (char& c : w) c = static_cast<char>(letter(random));
  return w;
}

std::string words(std::mt19937_64& random, double median, double sigma) {
  std::lognormal_distribution<double> count(std::log(median), sigma);
  const auto n = std::max<std::int64_t>(1, std::llround(count(random)));
  std::string text;
  for (std::int64_t i = 0; i < n; ++i) text += (i > 0 ? " " : "") + word(random);
  return text;
}

void write_records(const fs::path& file, const options& o) {
  std::mt19937_64 random(o.seed);
  std::ofstream out(file);
  for (std::int64_t k = 0; k < o.records; ++k) {
    const nlohmann::json record = {
        {"messages",
         {{{"role", "system"}, {"content", "You are a helpful assistant."}},
          {{"role", "user"}, {"content", words(random, o.question_words, o.question_sigma) + "?"}},
          {{"role", "assistant"}, {"content", words(random, o.answer_words, o.answer_sigma) + "."}}}}};
    out << record.dump() << "\n";
  }
}

at::Tensor rows_of(const std::vector<std::vector<std::int32_t>>& rows, std::int64_t width) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(rows.size()), width}, at::kLong);
  auto* p = t.data_ptr<std::int64_t>();
  for (const auto& row : rows) p = std::copy_n(row.begin(), width, p);
  return t;
}

// One epoch of `dataset` in batches of `size`: whole sequences (packed), or cut to their longest example.
arm epoch_of(std::string name, loom::data::chat_dataset& dataset, std::int64_t size, bool packed,
             std::int64_t seq_len) {
  arm a;
  a.name = std::move(name);
  const std::int64_t epoch = dataset.epoch();
  while (dataset.epoch() == epoch) {
    std::vector<std::vector<std::int32_t>> ids, labels, positions;
    batch b;
    std::int64_t width = 0;
    while (static_cast<std::int64_t>(ids.size()) < size && dataset.epoch() == epoch) {
      loom::data::packed_sequence s = dataset.next();
      ids.push_back(std::move(s.ids));
      labels.push_back(std::move(s.labels));
      positions.push_back(std::move(s.positions));
      b.tokens += s.tokens;
      width = std::max(width, s.tokens);
      a.examples += std::count(positions.back().begin(), positions.back().begin() + s.tokens, 0);
      if (!packed) a.lengths.push_back(static_cast<double>(s.tokens));
    }
    if (packed) width = seq_len;
    b.ids = rows_of(ids, width);
    b.labels = rows_of(labels, width);
    if (packed) b.positions = rows_of(positions, width);
    a.tokens += b.tokens;
    a.computed += static_cast<std::int64_t>(ids.size()) * width;
    a.batches.push_back(std::move(b));
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"Training tokens per second, packing against padding to the longest, on the same chat records"};
  app.add_option("--template", o.chat_template, "a chat template (Jinja)")->capture_default_str();
  app.add_option("--records", o.records, "chat records written and trained on, one epoch a pass")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--answer-words", o.answer_words, "the answers' median word count (log-normal)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--answer-sigma", o.answer_sigma, "the log-normal's sigma of the answers' word counts")
      ->capture_default_str();
  app.add_option("--question-words", o.question_words, "the questions' median word count (log-normal)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--question-sigma", o.question_sigma, "the log-normal's sigma of the questions' word counts")
      ->capture_default_str();
  app.add_option("--seq-len", o.seq_len, "tokens in a packed sequence; an example longer is cut to it")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "sequences (packed) or examples (padded) a step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--hidden", o.hidden, "the model's hidden size")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "decoder layers")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "attention heads (as many key-value heads)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--intermediate", o.intermediate, "the MLP's width")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--repetitions", o.repetitions, "timed passes of each arm, alternating")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps of each arm first")->capture_default_str();
  app.add_flag("--unmasked", o.unmasked,
               "a third arm: the packed batches without the mask (forward(ids, labels): examples see each other)");
  app.add_option("--threads", o.threads, "intra-op threads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "the records' and the model's")->capture_default_str();
  app.add_option("--folder", o.folder, "where the records are written (default: a fresh folder in the temp dir)");
  CLI11_PARSE(app, argc, argv);
  const fs::path folder = o.folder.empty() ? fs::temp_directory_path() / fmt::format("loom-chat-packing-{}", ::getpid())
                                           : fs::path(o.folder);
  try {
    torch::set_num_threads(o.threads);
    fs::create_directories(folder / "data");
    write_records(folder / "data" / "chat.jsonl", o);
    const auto tokenizer = loom::testing::byte_tokenizer(folder / "tokenizer");
    std::ifstream template_file(o.chat_template, std::ios::binary);
    if (!template_file) throw std::invalid_argument(fmt::format("cannot read --template {}", o.chat_template));
    const auto chat = loom::data::chat_template::from_text(
        std::string{std::istreambuf_iterator<char>(template_file), std::istreambuf_iterator<char>()});

    const auto dataset = [&](bool pack) {
      loom::data::chat_dataset_options data;
      data.paths = {folder / "data"};
      data.seq_len = o.seq_len;
      data.pack = pack;
      data.packing = loom::data::packing_strategy::first_fit_decreasing;
      data.pack_window = o.records;
      data.seed = o.seed;
      return loom::data::chat_dataset(chat, tokenizer, std::move(data));
    };
    auto packed_data = dataset(true);
    auto padded_data = dataset(false);
    const loom::data::chat_data_summary summary = packed_data.summary();
    std::vector<arm> arms;
    arms.push_back(epoch_of("padded", padded_data, o.batch, false, o.seq_len));
    arms.push_back(epoch_of("packed", packed_data, o.batch, true, o.seq_len));
    arms.back().masked = true;
    if (o.unmasked) {
      arms.push_back(arms.back());
      arms.back().name = "packed, no mask";
      arms.back().masked = false;
    }

    if (arms[0].tokens != arms[1].tokens || arms[0].examples != arms[1].examples)
      throw std::logic_error("the arms' epochs hold different numbers of examples or tokens");
    std::vector<double> lengths = arms[0].lengths;
    std::ranges::sort(lengths);
    const auto percentile = [&](double p) {
      return lengths[static_cast<std::size_t>(p * static_cast<double>(lengths.size() - 1))];
    };
    fmt::print(
        "{} records, {} examples{}, {} tokens (median {:.0f}, p90 {:.0f}, p99 {:.0f}, longest {:.0f}; {} cut to "
        "--seq-len {}), {:.1f} % carrying loss\n",
        o.records, summary.examples,
        summary.without_loss > 0 ? fmt::format(" ({} left out: no loss within --seq-len)", summary.without_loss) : "",
        summary.tokens, bench::median(lengths), percentile(0.9), percentile(0.99), lengths.back(), summary.truncated,
        o.seq_len, 100.0 * summary.loss_share());

    loom::models::causal_lm_config config;
    config.vocab_size = tokenizer.vocab_size();
    config.hidden_size = o.hidden;
    config.intermediate_size = o.intermediate;
    config.num_hidden_layers = o.layers;
    config.num_attention_heads = o.heads;
    config.num_key_value_heads = o.heads;
    config.head_dim = o.hidden / o.heads;
    config.max_position_embeddings = o.seq_len;
    auto job = loom::build(loom::model<loom::models::CausalLM>(config) | loom::seeded(o.seed) | loom::local(),
                           loom::runtime::from_env());
    loom::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.0));
    double last_loss = 0;
    const auto step = [&](const batch& b, bool masked) {
      const at::Tensor loss = masked ? job.forward(b.ids, b.labels, b.positions) : job.forward(b.ids, b.labels);
      job.backward(loss);
      optimizer.step();
      job.zero_grad();
      last_loss = loss.item<double>();
    };
    for (const arm& a : arms) {
      for (int s = 0; s < o.warmup; ++s) step(a.batches[static_cast<std::size_t>(s) % a.batches.size()], a.masked);
    }

    // rates[i]: arm i's tokens per second, a figure a repetition; ratios[i]: arm i's over the padded
    // arm's, in the same repetition.
    std::vector<std::vector<double>> rates(arms.size()), ratios(arms.size());
    for (int r = 0; r < o.repetitions; ++r) {
      std::string line = fmt::format("repetition {}:", r + 1);
      for (std::size_t i = 0; i < arms.size(); ++i) {
        const auto start = std::chrono::steady_clock::now();
        for (const batch& b : arms[i].batches) step(b, arms[i].masked);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        rates[i].push_back(static_cast<double>(arms[i].tokens) / seconds);
        ratios[i].push_back(rates[i].back() / rates[0].back());
        line += fmt::format(" {} {:.0f} tokens/s,", arms[i].name, rates[i].back());
      }
      fmt::print("{} last loss {:.4f}\n", line, last_loss);
    }

    fmt::print(
        "\n| arm | steps | examples | tokens | positions computed | padding share | tokens/s (median of {}) | / padded "
        "| "
        "repetitions' ratios |\n",
        o.repetitions);
    fmt::print("|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (std::size_t i = 0; i < arms.size(); ++i) {
      fmt::print("| {} | {} | {} | {} | {} | {:.1f} % | {:.0f} | {:.3f} | {} |\n", arms[i].name, arms[i].batches.size(),
                 arms[i].examples, arms[i].tokens, arms[i].computed, 100.0 * arms[i].padding_share(),
                 bench::median(rates[i]), bench::median(rates[i]) / bench::median(rates[0]),
                 i == 0 ? "" : bench::spread(ratios[i]));
    }
    if (o.folder.empty()) fs::remove_all(folder);
  } catch (const std::exception& error) {
    fmt::print(stderr, "chat-packing: {}\n", error.what());
    if (o.folder.empty()) fs::remove_all(folder);
    return 1;
  }
  return 0;
}
