#pragma once
// loom::data::text_dataset: documents from JSON Lines files (a text field per line), plain text files
// (a document per non-empty line) or llm.c token files (already tokenized), tokenized as they are
// read, joined with the tokenizer's EOS and packed into sequences of the run's length, as torchtitan
// packs them. Each epoch the documents are shuffled by the seed and the epoch, and data-parallel
// rank r of W takes the documents at positions r, r + W, r + 2W, ... of that order: no two ranks read
// the same document, so no two see the same sequence, and together they read all of it (the ranks of one
// sequence-parallel group pass the same rank and read the same sequences). A sequence's labels are its tokens (loom's
// causal-LM loss shifts them).
//
// Its position (the epoch, the documents this rank has read in it, the tokens waiting to be packed and
// the lines skipped) is state(), a JSON text that restore() takes back: a dataset restored from the
// state after sequence n gives what an uninterrupted one gives from n + 1 on. Bad input is refused in
// one sentence naming the file and line (or byte offset); skip_malformed skips lines that are not
// JSON or lack the text field instead, counting them.

#include <loom/data/tokenizer.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

struct text_dataset_options {
  // Files, or folders whose *.jsonl, *.json, *.txt and *.bin files are read (in name order). A .txt file
  // has a document per non-empty line; a .bin file is an llm.c token file whose documents are the runs
  // of tokens between EOS tokens; the others have a JSON object per non-empty line.
  std::vector<std::filesystem::path> paths;
  std::string text_field = "text";
  std::int64_t seq_len = 2048;
  std::uint64_t seed = 0;
  bool shuffle = true;
  bool skip_malformed = false;
  bool add_bos = false;  // each document starts with the tokenizer's BOS, as Llama 3's pretraining has it
  int rank = 0;          // data-parallel: job.data_rank()
  int world_size = 1;    // job.data_world_size()
  // How a refusal names text_field and skip_malformed: a program passes its own flags
  // ("--text-field", "--skip-malformed"), so that the message names what its user types.
  std::string text_field_option = "text_field";
  std::string skip_malformed_option = "skip_malformed";
};

class text_dataset {
 public:
  // Indexes the files (each document's place, not its text). Throws std::invalid_argument for options
  // or data that cannot work: no files, no documents, no EOS token, a sequence length below 1. The
  // dataset reads with `tokenizer`, which must outlive it (and any read_ahead it is moved into).
  text_dataset(const tokenizer& tokenizer, text_dataset_options options);
  text_dataset(text_dataset&&) noexcept;
  text_dataset& operator=(text_dataset&&) noexcept;
  ~text_dataset();

  // This rank's next sequence of seq_len tokens (its labels are the same tokens), going on into the
  // next epoch, reshuffled, when this one's documents run out.
  [[nodiscard]] std::vector<std::int32_t> next();

  [[nodiscard]] std::string state() const;
  // Throws std::invalid_argument for a state of other files, options or ranks, naming what differs.
  void restore(std::string_view state);

  // What the data is, for loom::train's data_identity: the files' names, their sizes and a digest of
  // their bytes (XXH3-64, computed as indexing reads them), "a.jsonl, b.jsonl (2 files, 5120 bytes,
  // digest 3c1e…)"; the same on every rank. Where the files lie does not count.
  [[nodiscard]] const std::string& identity() const noexcept;
  [[nodiscard]] std::int64_t epoch() const noexcept;
  [[nodiscard]] std::int64_t documents() const noexcept;      // in the whole dataset
  [[nodiscard]] std::int64_t skipped_lines() const noexcept;  // malformed lines skipped, on this rank

  struct impl;

 private:
  std::unique_ptr<impl> core_;
};

}  // namespace loom::data
