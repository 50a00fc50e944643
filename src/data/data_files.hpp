#pragma once
// What text_dataset and chat_dataset share of their files (src/data, not public): the files a run
// names, listed; each non-empty line's place, indexed as the file's digest is taken; the epoch's
// order; and a line read again, from a file that must still be as large as when it was indexed.
// `who` ("text_dataset") starts every refusal, as the dataset's own do.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data::detail {

// A file a dataset reads: its size and the XXH3-64 of its bytes when it was indexed.
struct data_file {
  std::filesystem::path path;
  std::uintmax_t size = 0;
  std::uint64_t xxh3 = 0;
};

// Where a line is: its file, the byte offset it starts at and its number from 1.
struct line_place {
  std::uint32_t file;
  std::uint64_t offset;
  std::uint64_t line;
};

// `paths` in order, a folder's files that `readable` takes in name order. std::invalid_argument for no
// paths, a folder with no such file (`kinds`: ".jsonl or .json files"), or a path that is not there.
[[nodiscard]] std::vector<data_file> listed_files(const std::vector<std::filesystem::path>& paths, std::string_view who,
                                                  bool (*readable)(const std::filesystem::path&),
                                                  std::string_view kinds);

// Appends the places of every non-empty line of `file` (the dataset's file number `index`) and sets its
// digest from the bytes read.
void index_lines(data_file& file, std::uint32_t index, std::vector<line_place>& places, std::string_view who);

// What the data is, for loom::train's data_identity: "a.jsonl, b.jsonl (2 files, 5120 bytes, digest
// 3c1e…)", from the files' names, sizes and digests; where they lie does not count.
[[nodiscard]] std::string identity_of(std::span<const data_file* const> files);

// `state` read back as `who`'s saved position of this very dataset: each key of `fingerprint` (the
// files, options and ranks) as the state's "dataset" object holds it. std::invalid_argument, in one
// sentence, for text that is not a state of `who`, or naming the first key that differs.
[[nodiscard]] nlohmann::json saved_state_of(std::string_view state, const nlohmann::json& fingerprint,
                                            std::string_view who);

// A permutation of 0..n-1 from (seed, epoch): Fisher-Yates over mt19937_64's outputs, whose sequence
// the C++ standard fixes (std::shuffle and the distributions it would use are the library's own
// choice), so that the order is the same on every machine.
[[nodiscard]] std::vector<std::uint64_t> shuffled_order(std::uint64_t n, std::uint64_t seed, std::int64_t epoch);

// The dataset's files, each opened once when first read and checked on every read to be there and as
// large as when it was indexed: std::runtime_error naming it otherwise.
class file_reader {
 public:
  explicit file_reader(std::string_view who) : who_(who) {}

  // `file` (number `place.file`), open and checked, for a read at `place`.
  [[nodiscard]] std::ifstream& checked(const data_file& file, const line_place& place);
  // The line at `place`, without its line end.
  [[nodiscard]] std::string line(const data_file& file, const line_place& place);

 private:
  std::string who_;
  std::vector<std::ifstream> open_;
};

}  // namespace loom::data::detail
