#pragma once
// loom::data::chat_dataset: instruction-tuning records from JSON Lines files (OpenAI's messages,
// ShareGPT's conversations, TRL's prompt/completion: one record a line), each made into an example by
// chat_example (rendered with the model's chat template, tokenized, labelled on the assistant's tokens)
// and packed into sequences of seq_len tokens whose examples keep their own positions from 0
// (packing.hpp), for CausalLM's forward(ids, labels, positions) (docs/data.md, "Chat data").
//
// Each epoch the records are shuffled by the seed and the epoch, and data-parallel rank r of W takes the
// records at positions r, r + W, r + 2W, ... of that order, as text_dataset shares out documents: no two
// ranks read the same record, and together they read all of them. First-fit decreasing packs this
// rank's examples pack_window at a time (a window's sequences are known once its examples are); greedy
// packs them as they come, and pack = false gives each example a sequence of its own, padded (the
// baseline that packing is measured against).
//
// Its position (the epoch, the window and the sequence in it, the records skipped) is state(), a JSON
// text that restore() takes back: a dataset restored from the state after sequence n gives what an
// uninterrupted one gives from n + 1 on. Bad records are refused in one sentence naming the file and
// line; skip_malformed skips them instead, counting them.

#include <loom/data/chat_example.hpp>
#include <loom/data/chat_template.hpp>
#include <loom/data/packing.hpp>
#include <loom/data/tokenizer.hpp>
#include <loom/dsl/options.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace loom::data {

struct chat_dataset_options {
  // Files, or folders whose *.jsonl and *.json files are read (in name order); each has a JSON object, a
  // record, per non-empty line.
  std::vector<std::filesystem::path> paths{};
  // How a record names its parts: OpenAI's messages and TRL's prompt/completion by default,
  // chat_fields::sharegpt() for ShareGPT's conversations; which roles map to the template's.
  chat_fields fields{};
  // Where the loss goes: the assistant's tokens (the completion's), or every token.
  loss_on loss = loss_on::assistant;
  // Passed to every render of the template: tools, documents, variables (enable_thinking, ...).
  chat_render_options render{};
  // The length of every sequence next() gives; an example longer than this is cut to it, and left out
  // when no token of it after the first carries loss then (chat_data_summary::without_loss).
  std::int64_t seq_len = 2048;
  // Several examples a sequence (each from position 0, attending within itself); false: one example a
  // sequence, the rest padding.
  bool pack = true;
  packing_strategy packing = packing_strategy::first_fit_decreasing;
  // How many of this rank's records first-fit decreasing packs together: more fills sequences better and
  // holds more examples in memory (a window's examples are tokenized when its first sequence is asked
  // for, and again on a restore into it). Greedy packs in the records' order and ignores it.
  std::int64_t pack_window = 1000;
  // The token padding fills the end of a sequence with (its labels are -100, so its value matters
  // little); the tokenizer's EOS when not given.
  std::optional<std::int32_t> pad_id{};
  std::uint64_t seed = 0;
  bool shuffle = true;  // false: the files' records in order, every epoch
  // Skip the records that are not JSON, or that chat_example or the template refuses, counting them
  // (skipped_records()), instead of refusing the run.
  bool skip_malformed = false;
  int rank = 0;        // data-parallel: job.data_rank()
  int world_size = 1;  // job.data_world_size()
  // How a refusal names `fields` and `skip_malformed`: a program passes its own flags ("--chat-fields",
  // "--skip-malformed"), so that the message names what its user types.
  std::string fields_option = "fields";
  std::string skip_malformed_option = "skip_malformed";
};

// The record shapes a run file names: OpenAI's messages (TRL's prompt/completion read with them) and
// ShareGPT's conversations.
enum class record_format { openai, sharegpt };
[[nodiscard]] std::string_view name_of(record_format format) noexcept;
constexpr std::array<record_format, 2> values_of(std::type_identity<record_format>) noexcept {
  return {record_format::openai, record_format::sharegpt};
}
[[nodiscard]] chat_fields fields_of(record_format format);

// What a run file's "chat" object sets (docs/run_files.md), in TRL's SFTConfig words where it has them;
// the defaults are chat_dataset_options'.
struct chat_options {
  // A Jinja file, or a folder with a tokenizer_config.json, whose template replaces the checkpoint's
  // (empty: the checkpoint's own).
  std::filesystem::path chat_template_path{};
  record_format format = record_format::openai;
  loss_on loss = chat_dataset_options{}.loss;
  bool pack = chat_dataset_options{}.pack;
  packing_strategy packing = chat_dataset_options{}.packing;
  std::int64_t pack_window = chat_dataset_options{}.pack_window;
  bool skip_malformed = chat_dataset_options{}.skip_malformed;

  static constexpr auto fields() {
    return std::tuple{option_field{"chat_template_path", &chat_options::chat_template_path},
                      option_field{"format", &chat_options::format},
                      option_field{"loss_on", &chat_options::loss},
                      option_field{"packing", &chat_options::pack},
                      option_field{"packing_strategy", &chat_options::packing},
                      option_field{"pack_window", &chat_options::pack_window},
                      option_field{"skip_malformed", &chat_options::skip_malformed}};
  }

  // `options` with these set: its fields, loss, packing and skip_malformed.
  [[nodiscard]] chat_dataset_options applied_to(chat_dataset_options options) const;
};

// What one epoch of a rank's data comes to, for a recipe to print before it trains.
struct chat_data_summary {
  std::int64_t examples = 0;        // records made into examples (an example of no tokens is left out)
  std::int64_t tokens = 0;          // the examples' tokens in the sequences, after cutting
  std::int64_t loss_tokens = 0;     // of those, the ones whose label is not -100
  std::int64_t sequences = 0;       // of seq_len tokens each
  std::int64_t padding_tokens = 0;  // sequences * seq_len - tokens
  std::int64_t truncated = 0;       // examples longer than seq_len, cut to it
  std::int64_t skipped = 0;         // malformed records skipped (skip_malformed)
  // Records left out because no token after their first carries loss once cut to seq_len (the
  // assistant's reply lies past the cut): they would teach nothing, and a micro-batch of them alone
  // would have no loss to average.
  std::int64_t without_loss = 0;
  std::int64_t seq_len = 0;

  // The share of the examples' tokens that carry loss.
  [[nodiscard]] double loss_share() const noexcept;
  // tokens / (sequences * seq_len): 1 when no token is padding.
  [[nodiscard]] double packing_efficiency() const noexcept;
};

class chat_dataset {
 public:
  // Indexes the files (each record's place, not its text). Throws std::invalid_argument, in one
  // sentence, for options or data that cannot work: no files, no records, fewer records than ranks, a
  // seq_len or pack_window below 1, no pad_id and a tokenizer without an EOS to pad with. `chat` and
  // `tokenizer` must outlive the dataset.
  chat_dataset(const chat_template& chat, const tokenizer& tokenizer, chat_dataset_options options);
  chat_dataset(chat_dataset&&) noexcept;
  chat_dataset& operator=(chat_dataset&&) noexcept;
  ~chat_dataset();

  // This rank's next sequence: seq_len ids, labels (-100 where no loss is taken, and on padding) and
  // positions (from 0 at each example's first token, and at the padding's). Goes on into the next
  // epoch, reshuffled, when this one's records run out. A bad record is refused here, when its window
  // is read: std::invalid_argument naming the file, the line and what is wrong with it.
  [[nodiscard]] packed_sequence next();

  [[nodiscard]] std::string state() const;
  // Throws std::invalid_argument for a state of other files, options or ranks, naming what differs.
  void restore(std::string_view state);

  // One epoch of this rank's records made into examples and packed as next() packs them (the first
  // epoch's order), counted. It costs what an epoch of next() costs in rendering and tokenizing (every
  // one of this rank's records, once), holding one window at a time; the position is left as it was. A
  // bad record is refused (or, with skip_malformed, counted) as next() would.
  [[nodiscard]] chat_data_summary summary() const;

  // What the data is, for loom::train's data_identity: the files' names, their sizes and a digest of
  // their bytes (XXH3-64, computed as indexing reads them), "a.jsonl, b.jsonl (2 files, 5120 bytes,
  // digest 3c1e…)"; the same on every rank. Where the files lie does not count.
  [[nodiscard]] const std::string& identity() const noexcept;
  // The epoch the next sequence comes from: it turns as the last sequence of an epoch is given (packed
  // first-fit decreasing, as the next is asked for where the epoch's last window holds only skipped records).
  [[nodiscard]] std::int64_t epoch() const noexcept;
  [[nodiscard]] std::int64_t records() const noexcept;          // in the whole dataset
  [[nodiscard]] std::int64_t skipped_records() const noexcept;  // malformed records skipped, on this rank

  struct impl;

 private:
  std::unique_ptr<impl> core_;
};

}  // namespace loom::data
