#include <loom/base/spelling.hpp>
#include <loom/base/text.hpp>
#include <loom/data/text_dataset.hpp>
#include <loom/io/checksum.hpp>

#include "data_files.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <utility>

namespace loom::data {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

enum class file_kind { json_lines, text, tokens };

struct source_file : detail::data_file {
  file_kind kind = file_kind::json_lines;
  std::size_t token_width = 0;  // tokens: 2 (uint16) or 4 (uint32) bytes each
};

// llm.c's token files (dev/data/data_common.py's write_datafile, dsl_examples/data/make_tokens.py):
// 256 little-endian int32 (a magic number, a version, the token count, zeros), then the tokens.
constexpr std::int32_t uint16_tokens_magic = 20240520;
constexpr std::int32_t uint32_tokens_magic = 20240801;
constexpr std::size_t token_header_bytes = 256 * sizeof(std::int32_t);

// Where a document is: its file, the byte offset of its line (of its first token) and the line's
// number from 1 (the token's index).
using document = detail::line_place;

bool readable_extension(const fs::path& path) {
  const std::string extension = path.extension().string();
  return extension == ".jsonl" || extension == ".json" || extension == ".txt" || extension == ".bin";
}

file_kind kind_of(const fs::path& path) {
  if (path.extension() == ".txt") return file_kind::text;
  if (path.extension() == ".bin") return file_kind::tokens;
  return file_kind::json_lines;
}

std::vector<source_file> source_files(const std::vector<fs::path>& paths) {
  std::vector<source_file> files;
  for (detail::data_file& listed :
       detail::listed_files(paths, "text_dataset", readable_extension, ".jsonl, .json, .txt or .bin files")) {
    const file_kind kind = kind_of(listed.path);
    files.push_back({std::move(listed), kind, 0});
  }
  return files;
}

// A token file's documents: the runs of tokens between the EOS tokens that delimit them (llm.c puts
// one before each document). Checks the header and the size; sets the file's token width.
void index_token_file(source_file& file, std::uint32_t index, std::int32_t eos, std::vector<document>& documents) {
  std::ifstream in(file.path, std::ios::binary);
  std::array<std::int32_t, 256> header{};
  in.read(reinterpret_cast<char*>(header.data()), token_header_bytes);
  if (in.gcount() != static_cast<std::streamsize>(token_header_bytes) ||
      (header[0] != uint16_tokens_magic && header[0] != uint32_tokens_magic)) {
    throw_error<std::invalid_argument>(
        "text_dataset: {} has no llm.c header (a first int32 of {} for uint16 tokens or {} for uint32 ones): write "
        "it with dsl_examples/data/make_tokens.py or llm.c's write_datafile",
        file.path.string(), uint16_tokens_magic, uint32_tokens_magic);
  }
  file.token_width = header[0] == uint16_tokens_magic ? 2 : 4;
  const std::uintmax_t expected =
      token_header_bytes + static_cast<std::uintmax_t>(std::max(header[2], 0)) * file.token_width;
  if (header[2] <= 0 || file.size != expected) {
    throw_error<std::invalid_argument>(
        "text_dataset: {}'s header counts {} tokens of {} bytes, {} bytes in all, but the file has {}{}",
        file.path.string(), header[2], file.token_width, expected, file.size,
        file.size < expected ? ": it is truncated" : "");
  }
  std::vector<char> bytes(static_cast<std::size_t>(header[2]) * file.token_width);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  xxh3_stream checksum;
  checksum.update(header.data(), token_header_bytes);
  checksum.update(bytes.data(), bytes.size());
  file.xxh3 = checksum.digest().xxh3;
  bool inside = false;
  for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(header[2]); ++i) {
    std::uint32_t id = 0;
    std::memcpy(&id, bytes.data() + i * file.token_width, file.token_width);
    const bool delimiter = id == static_cast<std::uint32_t>(eos);
    if (!delimiter && !inside) documents.push_back({index, token_header_bytes + i * file.token_width, i});
    inside = !delimiter;
  }
}

// Every non-empty line of every text file, every document of every token file, in order.
std::vector<document> index_documents(std::vector<source_file>& files, std::int32_t eos) {
  std::vector<document> documents;
  for (std::uint32_t f = 0; f < files.size(); ++f) {
    if (files[f].kind == file_kind::tokens) {
      index_token_file(files[f], f, eos, documents);
      continue;
    }
    detail::index_lines(files[f], f, documents, "text_dataset");
  }
  return documents;
}

}  // namespace

struct text_dataset::impl {
  const tokenizer* tok;
  text_dataset_options options;
  std::vector<source_file> files;
  std::vector<document> all;
  std::int32_t eos = 0;
  std::optional<std::int32_t> bos;

  // The position.
  std::int64_t epoch = 0;
  std::uint64_t read_in_epoch = 0;  // this rank's documents read in this epoch
  std::vector<std::int32_t> waiting;
  std::int64_t skipped = 0;
  std::int64_t sequences_in_epoch = 0;

  std::vector<std::uint64_t> order;  // this epoch's order of all documents
  std::int64_t order_epoch = -1;
  detail::file_reader reader{"text_dataset"};

  [[nodiscard]] std::uint64_t rank_documents() const {
    const auto n = static_cast<std::uint64_t>(all.size());
    const auto r = static_cast<std::uint64_t>(options.rank), w = static_cast<std::uint64_t>(options.world_size);
    return n / w + (r < n % w ? 1 : 0);
  }

  const document& document_at(std::uint64_t k) {
    if (order_epoch != epoch) {
      order = options.shuffle ? detail::shuffled_order(all.size(), options.seed, epoch) : std::vector<std::uint64_t>{};
      order_epoch = epoch;
    }
    const std::uint64_t position =
        k * static_cast<std::uint64_t>(options.world_size) + static_cast<std::uint64_t>(options.rank);
    return all[options.shuffle ? order[position] : position];
  }

  // The line of `doc`, read again from its file.
  std::string line_of(const document& doc) { return reader.line(files[doc.file], doc); }

  // A token file's document: its tokens up to the next EOS or the file's end, each checked against
  // the tokenizer's vocabulary.
  std::vector<std::int32_t> tokens_of(const document& doc) {
    const source_file& file = files[doc.file];
    std::ifstream& in = reader.checked(file, doc);
    std::vector<std::int32_t> ids;
    for (std::uint64_t index = doc.line;; ++index) {
      std::uint32_t id = 0;
      if (!in.read(reinterpret_cast<char*>(&id), static_cast<std::streamsize>(file.token_width))) break;
      if (id == static_cast<std::uint32_t>(eos)) break;
      if (id >= static_cast<std::uint32_t>(tok->vocab_size())) {
        throw_error<std::invalid_argument>(
            "text_dataset: {}: token {} is id {}, not below the tokenizer's vocabulary of {}: the file was made "
            "with another tokenizer",
            file.path.string(), index, id, tok->vocab_size());
      }
      ids.push_back(static_cast<std::int32_t>(id));
    }
    return ids;
  }

  // The document's text, or nothing for a malformed line that skip_malformed skips.
  std::optional<std::string> text_of(const document& doc) {
    std::string line = line_of(doc);
    const source_file& file = files[doc.file];
    if (file.kind == file_kind::text) return line;
    const auto malformed = [&](const std::string& what) -> std::optional<std::string> {
      if (!options.skip_malformed) {
        throw_error<std::invalid_argument>("text_dataset: {}:{}: {} ({} skips such lines, counting them)",
                                           file.path.string(), doc.line, what, options.skip_malformed_option);
      }
      ++skipped;
      return std::nullopt;
    };
    json parsed = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) return malformed("the line is not JSON");
    if (!parsed.is_object()) return malformed("the line is JSON but not an object of fields");
    if (!parsed.contains(options.text_field)) {
      std::vector<std::string> fields;
      for (const auto& [key, value] : parsed.items()) fields.push_back(key);
      return malformed(fmt::format("the line has no \"{}\" field, only {}{}; {} names the field to read",
                                   options.text_field, some_of(fields), did_you_mean(options.text_field, fields, "\""),
                                   options.text_field_option));
    }
    if (!parsed[options.text_field].is_string())
      return malformed(fmt::format("the line's \"{}\" is not a string", options.text_field));
    return parsed[options.text_field].get<std::string>();
  }

  void read_next_document() {
    if (read_in_epoch == rank_documents()) {
      if (sequences_in_epoch == 0) {
        throw_error<std::invalid_argument>(
            "text_dataset: rank {}'s share of the data ({} of {} documents) does not fill one sequence of {} tokens: "
            "give a shorter seq_len or more data",
            options.rank, rank_documents(), all.size(), options.seq_len);
      }
      ++epoch;
      read_in_epoch = 0;
      sequences_in_epoch = 0;
    }
    const document& doc = document_at(read_in_epoch);
    ++read_in_epoch;
    std::vector<std::int32_t> ids;
    if (files[doc.file].kind == file_kind::tokens) {
      ids = tokens_of(doc);
    } else {
      const std::optional<std::string> text = text_of(doc);
      if (!text) return;
      try {
        ids = tok->encode(*text);
      } catch (const std::invalid_argument& error) {
        throw_error<std::invalid_argument>("text_dataset: {}:{}: {}", files[doc.file].path.string(), doc.line,
                                           std::string_view(error.what()).substr(message_prefix.size()));
      }
    }
    if (bos) waiting.push_back(*bos);
    waiting.insert(waiting.end(), ids.begin(), ids.end());
    waiting.push_back(eos);
  }

  // What a saved state must match: the files and their sizes, the options, the ranks. Made once, as
  // the dataset is built; state() runs once per sequence under read_ahead.
  json fingerprint;
  // The files' names and contents alone (identity()), made once too.
  std::string identity;

  [[nodiscard]] std::string make_identity() const {
    std::vector<const detail::data_file*> listed;
    for (const source_file& f : files) listed.push_back(&f);
    return detail::identity_of(listed);
  }

  [[nodiscard]] json make_fingerprint() const {
    json listed = json::array();
    for (const source_file& f : files) listed.push_back({{"path", f.path.string()}, {"size", f.size}});
    return {{"files", listed},           {"text_field", options.text_field}, {"seq_len", options.seq_len},
            {"seed", options.seed},      {"shuffle", options.shuffle},       {"add_bos", options.add_bos},
            {"rank", options.rank},      {"world_size", options.world_size}, {"documents", all.size()},
            {"vocab", tok->vocab_size()}};
  }
};

text_dataset::text_dataset(const tokenizer& tokenizer, text_dataset_options options) : core_(std::make_unique<impl>()) {
  impl& c = *core_;
  if (options.seq_len < 1)
    throw_error<std::invalid_argument>("text_dataset: seq_len is {}; give at least 1", options.seq_len);
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw_error<std::invalid_argument>("text_dataset: rank {} of {} data-parallel ranks: give 0 <= rank < world_size",
                                       options.rank, options.world_size);
  }
  if (!tokenizer.eos_token_id()) {
    throw_error<std::invalid_argument>(
        "text_dataset: the tokenizer has no EOS token to join documents with (its tokenizer_config.json names none)");
  }
  if (options.add_bos && !tokenizer.bos_token_id())
    throw_error<std::invalid_argument>("text_dataset: add_bos is set, and the tokenizer has no BOS token");
  c.tok = &tokenizer;
  c.eos = *tokenizer.eos_token_id();
  if (options.add_bos) c.bos = tokenizer.bos_token_id();
  c.files = source_files(options.paths);
  c.all = index_documents(c.files, c.eos);
  if (c.all.empty()) {
    std::vector<std::string> names;
    for (const source_file& f : c.files) names.push_back(f.path.string());
    throw_error<std::invalid_argument>("text_dataset: no documents in {}: every line is empty", some_of(names));
  }
  if (c.all.size() < static_cast<std::size_t>(options.world_size)) {
    throw_error<std::invalid_argument>("text_dataset: {} for {} data-parallel ranks: each rank needs one at least",
                                       counted(static_cast<std::int64_t>(c.all.size()), "document"),
                                       options.world_size);
  }
  c.options = std::move(options);
  c.fingerprint = c.make_fingerprint();
  c.identity = c.make_identity();
}

text_dataset::text_dataset(text_dataset&&) noexcept = default;
text_dataset& text_dataset::operator=(text_dataset&&) noexcept = default;
text_dataset::~text_dataset() = default;

std::vector<std::int32_t> text_dataset::next() {
  impl& c = *core_;
  const auto length = static_cast<std::size_t>(c.options.seq_len);
  while (c.waiting.size() < length) c.read_next_document();
  std::vector<std::int32_t> sequence(c.waiting.begin(), c.waiting.begin() + static_cast<std::ptrdiff_t>(length));
  c.waiting.erase(c.waiting.begin(), c.waiting.begin() + static_cast<std::ptrdiff_t>(length));
  ++c.sequences_in_epoch;
  return sequence;
}

std::string text_dataset::state() const {
  const impl& c = *core_;
  return json{{"dataset", c.fingerprint},
              {"epoch", c.epoch},
              {"documents_read", c.read_in_epoch},
              {"sequences_in_epoch", c.sequences_in_epoch},
              {"waiting", c.waiting},
              {"skipped_lines", c.skipped}}
      .dump();
}

void text_dataset::restore(std::string_view state) {
  impl& c = *core_;
  const json saved = detail::saved_state_of(state, c.fingerprint, "text_dataset");
  try {
    c.epoch = saved.at("epoch").get<std::int64_t>();
    c.read_in_epoch = saved.at("documents_read").get<std::uint64_t>();
    c.sequences_in_epoch = saved.at("sequences_in_epoch").get<std::int64_t>();
    c.waiting = saved.at("waiting").get<std::vector<std::int32_t>>();
    c.skipped = saved.at("skipped_lines").get<std::int64_t>();
  } catch (const json::exception& error) {
    throw_error<std::invalid_argument>("text_dataset: the state to restore is damaged: {}", error.what());
  }
  if (c.read_in_epoch > c.rank_documents() || c.epoch < 0)
    throw_error<std::invalid_argument>("text_dataset: the state to restore is damaged: its position is past the data");
}

const std::string& text_dataset::identity() const noexcept { return core_->identity; }

std::int64_t text_dataset::epoch() const noexcept { return core_->epoch; }
std::int64_t text_dataset::documents() const noexcept { return static_cast<std::int64_t>(core_->all.size()); }
std::int64_t text_dataset::skipped_lines() const noexcept { return core_->skipped; }

}  // namespace loom::data
