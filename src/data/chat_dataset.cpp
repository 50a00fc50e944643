#include <loom/base/spelling.hpp>
#include <loom/base/text.hpp>
#include <loom/data/chat_dataset.hpp>

#include "data_files.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <utility>

namespace loom::data {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
namespace fs = std::filesystem;

using source_file = detail::data_file;
// Where a record is: its file, the byte offset of its line and the line's number from 1.
using record_place = detail::line_place;

bool readable_extension(const fs::path& path) { return path.extension() == ".jsonl" || path.extension() == ".json"; }

// A message of loom's without its "loom: ", to go on inside another sentence.
std::string_view sentence_of(const std::exception& error) {
  std::string_view text = error.what();
  if (text.starts_with(message_prefix)) text.remove_prefix(message_prefix.size());
  return text;
}

std::string_view loss_name(loss_on loss) { return loss == loss_on::assistant ? "assistant" : "every_token"; }

}  // namespace

double chat_data_summary::loss_share() const noexcept {
  return tokens == 0 ? 0.0 : static_cast<double>(loss_tokens) / static_cast<double>(tokens);
}

double chat_data_summary::packing_efficiency() const noexcept {
  return sequences == 0 ? 0.0 : static_cast<double>(tokens) / (static_cast<double>(sequences) * seq_len);
}

struct chat_dataset::impl {
  const chat_template* chat = nullptr;
  const tokenizer* tok = nullptr;
  chat_dataset_options options;
  std::vector<source_file> files;
  std::vector<record_place> all;
  std::int32_t pad = 0;

  // A run of this rank's records, [start, end) in the epoch's order, made into examples and packed: a
  // first-fit-decreasing window of pack_window records, or, packed greedily or not at all, the records
  // of one sequence.
  struct window {
    std::uint64_t start = 0;
    std::uint64_t end = 0;
    std::vector<example> examples{};
    std::vector<std::vector<std::size_t>> sequences{};  // indices into examples, as lay_out takes them
  };

  // The position: the epoch, where its current window starts among this rank's records, the sequences
  // of the window given already.
  std::int64_t epoch = 0;
  std::uint64_t window_start = 0;
  std::size_t sequence_in_window = 0;
  std::int64_t sequences_in_epoch = 0;
  std::int64_t skipped = 0;
  // Restored into the middle of a window: its skipped records were counted before the state was saved,
  // so building it again does not count them again.
  bool window_skips_counted = false;
  std::optional<window> current;

  // Caches, not position: this epoch's order; the example greedy read past the end of its last sequence,
  // which starts the next one; the open files.
  mutable std::vector<std::uint64_t> order;
  mutable std::int64_t order_epoch = -1;
  struct carried_example {
    std::int64_t epoch;
    std::uint64_t index;
    example made;
  };
  mutable std::optional<carried_example> carried;
  mutable detail::file_reader reader{"chat_dataset"};

  // What a saved state must match (the files and their sizes, the options, the ranks) and the files'
  // identity, both made once as the dataset is built.
  json fingerprint;
  std::string identity;

  [[nodiscard]] std::uint64_t rank_records() const {
    const auto n = static_cast<std::uint64_t>(all.size());
    const auto r = static_cast<std::uint64_t>(options.rank), w = static_cast<std::uint64_t>(options.world_size);
    return n / w + (r < n % w ? 1 : 0);
  }

  // The place of this rank's k-th record of `at_epoch`.
  const record_place& place_at(std::int64_t at_epoch, std::uint64_t k) const {
    const std::uint64_t position =
        k * static_cast<std::uint64_t>(options.world_size) + static_cast<std::uint64_t>(options.rank);
    if (!options.shuffle) return all[position];
    if (order_epoch != at_epoch) {
      order = detail::shuffled_order(all.size(), options.seed, at_epoch);
      order_epoch = at_epoch;
    }
    return all[order[position]];
  }

  // The line of `place`, read again from its file, which must be open and as large as when it was indexed.
  std::string line_of(const record_place& place) const { return reader.line(files[place.file], place); }

  // Why a record has no shape chat_example reads, with the fields it has: chat_example's own sentence
  // cannot name the option that says which fields to read.
  [[nodiscard]] std::optional<std::string> shape_problem(const ordered_json& record) const {
    if (!record.is_object()) return "the line is JSON but not an object of fields";
    const chat_fields& f = options.fields;
    if (record.contains(f.messages) || (record.contains(f.prompt) && record.contains(f.completion))) return {};
    std::vector<std::string> keys;
    for (const auto& [key, value] : record.items()) keys.push_back(key);
    return fmt::format("the record has neither '{}' nor both '{}' and '{}', only {}{}; {} names the record's fields",
                       f.messages, f.prompt, f.completion, some_of(keys), did_you_mean(f.messages, keys, "'"),
                       options.fields_option);
  }

  // The records a window leaves out, by why.
  struct left_out {
    std::int64_t malformed = 0;     // skip_malformed skipped them
    std::int64_t without_loss = 0;  // no token after its first carries loss once cut to seq_len
  };

  // This rank's k-th record of `at_epoch` made into an example; nothing for one skip_malformed skips,
  // one of no tokens, or one whose loss is all past seq_len (nothing to train on: a micro-batch of only
  // such examples would have no loss to average), counted in `left`.
  std::optional<example> example_at(std::int64_t at_epoch, std::uint64_t k, left_out& left) const {
    if (carried && carried->epoch == at_epoch && carried->index == k) {
      example made = std::move(carried->made);
      carried.reset();
      return made;
    }
    const record_place& place = place_at(at_epoch, k);
    const auto malformed = [&](std::string_view what) -> std::optional<example> {
      if (!options.skip_malformed) {
        throw_error<std::invalid_argument>("chat_dataset: {}:{}: {} ({} skips such records, counting them)",
                                           files[place.file].path.string(), place.line, what,
                                           options.skip_malformed_option);
      }
      ++left.malformed;
      return std::nullopt;
    };
    const ordered_json record = ordered_json::parse(line_of(place), nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded()) return malformed("the line is not JSON");
    if (const auto problem = shape_problem(record)) return malformed(*problem);
    example made;
    try {
      made = chat_example(record, options.fields, *chat, *tok, options.loss, options.render);
    } catch (const std::invalid_argument& error) {
      return malformed(sentence_of(error));
    } catch (const chat_template_error& error) {
      return malformed(fmt::format("the chat template fails on the record: {}", sentence_of(error)));
    }
    if (made.ids.empty()) return std::nullopt;
    // The forward takes no loss at an example's first token: its label would be predicted from the
    // example before it in the sequence.
    const auto labels_kept = made.labels.begin() + fitted(made);
    if (std::all_of(made.labels.begin() + 1, labels_kept, [](std::int32_t label) { return label == -100; })) {
      ++left.without_loss;
      return std::nullopt;
    }
    return made;
  }

  [[nodiscard]] std::int64_t fitted(const example& e) const {
    return std::min(static_cast<std::int64_t>(e.ids.size()), options.seq_len);
  }

  // The window of this rank's records of `at_epoch` that starts at `start`, its skipped records added to
  // `left`.
  window window_at(std::int64_t at_epoch, std::uint64_t start, left_out& left) const {
    const std::uint64_t count = rank_records();
    window made{.start = start, .end = start};
    if (options.pack && options.packing == packing_strategy::first_fit_decreasing) {
      made.end = std::min(count, start + static_cast<std::uint64_t>(options.pack_window));
      for (std::uint64_t k = start; k < made.end; ++k)
        if (auto e = example_at(at_epoch, k, left)) made.examples.push_back(std::move(*e));
      std::vector<std::int64_t> lengths;
      for (const example& e : made.examples) lengths.push_back(static_cast<std::int64_t>(e.ids.size()));
      made.sequences = pack(lengths, options.seq_len, options.packing);
      return made;
    }
    // Greedy, or one example a sequence: the records of one sequence, and the skipped ones after them, so
    // that the window of an epoch's last example ends at the epoch's end (epoch() turns with the last
    // sequence). The next example, read to see that it does not fit, is carried to the next window
    // rather than read twice.
    std::int64_t room = options.seq_len;
    while (made.end < count) {
      std::optional<example> e = example_at(at_epoch, made.end, left);
      if (!e) {
        ++made.end;
        continue;
      }
      if (!made.examples.empty() && (!options.pack || fitted(*e) > room)) {
        carried = carried_example{at_epoch, made.end, std::move(*e)};
        break;
      }
      room -= fitted(*e);
      made.examples.push_back(std::move(*e));
      ++made.end;
    }
    if (!made.examples.empty()) {
      made.sequences.emplace_back(made.examples.size());
      for (std::size_t i = 0; i < made.examples.size(); ++i) made.sequences.back()[i] = i;
    }
    return made;
  }

  // On to the next window, and into the next epoch after the last.
  void leave_window() {
    window_start = current->end;
    sequence_in_window = 0;
    current.reset();
    if (window_start < rank_records()) return;
    if (sequences_in_epoch == 0) {
      throw_error<std::invalid_argument>(
          "chat_dataset: none of rank {}'s {} (of {}) made an example in epoch {}: each was skipped as malformed "
          "({} skipped so far), has no tokens, or carries no loss within seq_len",
          options.rank, counted(static_cast<std::int64_t>(rank_records()), "record"), all.size(), epoch, skipped);
    }
    ++epoch;
    window_start = 0;
    sequences_in_epoch = 0;
  }

  [[nodiscard]] std::string make_identity() const {
    std::vector<const detail::data_file*> listed;
    for (const source_file& f : files) listed.push_back(&f);
    return detail::identity_of(listed);
  }

  [[nodiscard]] json make_fingerprint() const {
    json listed = json::array();
    for (const source_file& f : files) listed.push_back({{"path", f.path.string()}, {"size", f.size}});
    const chat_fields& f = options.fields;
    const json fields = {{"messages", f.messages},     {"role", f.role},  {"content", f.content}, {"prompt", f.prompt},
                         {"completion", f.completion}, {"roles", f.roles}};
    // The render's values as their JSON text, keys in their given order (which the template sees).
    const json render = {{"add_generation_prompt", options.render.add_generation_prompt},
                         {"tools", options.render.tools.dump()},
                         {"documents", options.render.documents.dump()},
                         {"variables", options.render.variables.dump()}};
    return {{"files", listed},
            {"template", fmt::format("{:016x}", chat->digest())},
            {"fields", fields},
            {"loss", loss_name(options.loss)},
            {"render", render},
            {"seq_len", options.seq_len},
            {"pack", options.pack},
            {"packing", name_of(options.packing)},
            {"pack_window", options.pack_window},
            {"pad_id", pad},
            {"seed", options.seed},
            {"shuffle", options.shuffle},
            {"rank", options.rank},
            {"world_size", options.world_size},
            {"records", all.size()},
            {"vocab", tok->vocab_size()}};
  }
};

std::string_view name_of(record_format format) noexcept {
  return format == record_format::openai ? "openai" : "sharegpt";
}

chat_fields fields_of(record_format format) {
  return format == record_format::openai ? chat_fields{} : chat_fields::sharegpt();
}

chat_dataset_options chat_options::applied_to(chat_dataset_options options) const {
  options.fields = fields_of(format);
  options.loss = loss;
  options.pack = pack;
  options.packing = packing;
  options.pack_window = pack_window;
  options.skip_malformed = skip_malformed;
  return options;
}

chat_dataset::chat_dataset(const chat_template& chat, const tokenizer& tokenizer, chat_dataset_options options)
    : core_(std::make_unique<impl>()) {
  impl& c = *core_;
  if (options.seq_len < 1)
    throw_error<std::invalid_argument>("chat_dataset: seq_len is {}; give at least 1", options.seq_len);
  if (options.pack_window < 1)
    throw_error<std::invalid_argument>("chat_dataset: pack_window is {}; give at least 1", options.pack_window);
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw_error<std::invalid_argument>("chat_dataset: rank {} of {} data-parallel ranks: give 0 <= rank < world_size",
                                       options.rank, options.world_size);
  }
  if (options.pad_id) {
    if (*options.pad_id < 0 || *options.pad_id >= tokenizer.vocab_size()) {
      throw_error<std::invalid_argument>("chat_dataset: pad_id {} is not a token of the tokenizer's {}",
                                         *options.pad_id, tokenizer.vocab_size());
    }
    c.pad = *options.pad_id;
  } else if (const auto eos = tokenizer.eos_token_id()) {
    c.pad = *eos;
  } else {
    throw_error<std::invalid_argument>(
        "chat_dataset: the tokenizer has no EOS token to pad sequences with (its tokenizer_config.json names none): "
        "give pad_id");
  }
  c.chat = &chat;
  c.tok = &tokenizer;
  c.files = detail::listed_files(options.paths, "chat_dataset", readable_extension, ".jsonl or .json files");
  for (std::uint32_t f = 0; f < c.files.size(); ++f) detail::index_lines(c.files[f], f, c.all, "chat_dataset");
  if (c.all.empty()) {
    std::vector<std::string> names;
    for (const source_file& f : c.files) names.push_back(f.path.string());
    throw_error<std::invalid_argument>("chat_dataset: no records in {}: every line is empty", some_of(names));
  }
  if (c.all.size() < static_cast<std::size_t>(options.world_size)) {
    throw_error<std::invalid_argument>("chat_dataset: {} for {} data-parallel ranks: each rank needs one at least",
                                       counted(static_cast<std::int64_t>(c.all.size()), "record"), options.world_size);
  }
  c.options = std::move(options);
  c.fingerprint = c.make_fingerprint();
  c.identity = c.make_identity();
}

chat_dataset::chat_dataset(chat_dataset&&) noexcept = default;
chat_dataset& chat_dataset::operator=(chat_dataset&&) noexcept = default;
chat_dataset::~chat_dataset() = default;

packed_sequence chat_dataset::next() {
  impl& c = *core_;
  while (true) {
    if (!c.current) {
      impl::left_out left;
      c.current = c.window_at(c.epoch, c.window_start, left);
      if (!c.window_skips_counted) c.skipped += left.malformed;
      c.window_skips_counted = false;
      if (c.sequence_in_window > 0 && c.sequence_in_window >= c.current->sequences.size()) {
        throw_error<std::invalid_argument>(
            "chat_dataset: the restored state is damaged: it is at sequence {} of a window that has {}",
            c.sequence_in_window, c.current->sequences.size());
      }
    }
    if (c.sequence_in_window < c.current->sequences.size()) break;
    c.leave_window();  // a window whose records were all skipped
  }
  packed_sequence sequence =
      lay_out(c.current->examples, c.current->sequences[c.sequence_in_window], c.options.seq_len, c.pad);
  ++c.sequence_in_window;
  ++c.sequences_in_epoch;
  if (c.sequence_in_window == c.current->sequences.size()) c.leave_window();
  return sequence;
}

std::string chat_dataset::state() const {
  const impl& c = *core_;
  return json{{"dataset", c.fingerprint},
              {"epoch", c.epoch},
              {"records_read", c.window_start},
              {"sequence_in_window", c.sequence_in_window},
              {"sequences_in_epoch", c.sequences_in_epoch},
              {"skipped_records", c.skipped}}
      .dump();
}

void chat_dataset::restore(std::string_view state) {
  impl& c = *core_;
  const json saved = detail::saved_state_of(state, c.fingerprint, "chat_dataset");
  std::int64_t epoch = 0, sequences_in_epoch = 0, skipped = 0;
  std::uint64_t records_read = 0;
  std::size_t sequence_in_window = 0;
  try {
    epoch = saved.at("epoch").get<std::int64_t>();
    records_read = saved.at("records_read").get<std::uint64_t>();
    sequence_in_window = saved.at("sequence_in_window").get<std::size_t>();
    sequences_in_epoch = saved.at("sequences_in_epoch").get<std::int64_t>();
    skipped = saved.at("skipped_records").get<std::int64_t>();
  } catch (const json::exception& error) {
    throw_error<std::invalid_argument>("chat_dataset: the state to restore is damaged: {}", error.what());
  }
  if (epoch < 0 || records_read >= c.rank_records() || sequences_in_epoch < 0 || skipped < 0)
    throw_error<std::invalid_argument>("chat_dataset: the state to restore is damaged: its position is past the data");
  c.epoch = epoch;
  c.window_start = records_read;
  c.sequence_in_window = sequence_in_window;
  c.sequences_in_epoch = sequences_in_epoch;
  c.skipped = skipped;
  c.window_skips_counted = sequence_in_window > 0;
  c.current.reset();
}

chat_data_summary chat_dataset::summary() const {
  const impl& c = *core_;
  chat_data_summary counts{.seq_len = c.options.seq_len};
  impl::left_out left;
  for (std::uint64_t start = 0; start < c.rank_records();) {
    const impl::window w = c.window_at(0, start, left);
    for (const example& e : w.examples) {
      const std::int64_t kept = c.fitted(e);
      ++counts.examples;
      counts.tokens += kept;
      counts.truncated += kept < static_cast<std::int64_t>(e.ids.size()) ? 1 : 0;
      counts.loss_tokens +=
          std::count_if(e.labels.begin(), e.labels.begin() + kept, [](std::int32_t label) { return label != -100; });
    }
    counts.sequences += static_cast<std::int64_t>(w.sequences.size());
    start = w.end;
  }
  counts.padding_tokens = counts.sequences * c.options.seq_len - counts.tokens;
  counts.skipped = left.malformed;
  counts.without_loss = left.without_loss;
  return counts;
}

const std::string& chat_dataset::identity() const noexcept { return core_->identity; }
std::int64_t chat_dataset::epoch() const noexcept { return core_->epoch; }
std::int64_t chat_dataset::records() const noexcept { return static_cast<std::int64_t>(core_->all.size()); }
std::int64_t chat_dataset::skipped_records() const noexcept { return core_->skipped; }

}  // namespace loom::data
