#include "data_files.hpp"

#include <loom/base/text.hpp>
#include <loom/io/checksum.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <random>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace loom::data::detail {

namespace fs = std::filesystem;

std::vector<data_file> listed_files(const std::vector<fs::path>& paths, std::string_view who,
                                    bool (*readable)(const fs::path&), std::string_view kinds) {
  if (paths.empty()) throw_error<std::invalid_argument>("{}: no paths given: name files or folders of data", who);
  std::vector<data_file> files;
  for (const fs::path& path : paths) {
    std::error_code error;
    if (fs::is_directory(path, error)) {
      std::vector<fs::path> found;
      for (const auto& entry : fs::directory_iterator(path))
        if (entry.is_regular_file() && readable(entry.path())) found.push_back(entry.path());
      std::ranges::sort(found);
      if (found.empty()) throw_error<std::invalid_argument>("{}: the folder {} has no {}", who, path.string(), kinds);
      for (const fs::path& file : found) files.push_back({file, fs::file_size(file)});
    } else if (fs::is_regular_file(path, error)) {
      files.push_back({path, fs::file_size(path)});
    } else {
      throw_error<std::invalid_argument>("{}: {} is neither a file nor a folder: there is no such path", who,
                                         path.string());
    }
  }
  return files;
}

void index_lines(data_file& file, std::uint32_t index, std::vector<line_place>& places, std::string_view who) {
  std::ifstream in(file.path, std::ios::binary);
  if (!in) throw_error<std::invalid_argument>("{}: cannot read {}", who, file.path.string());
  std::vector<char> buffer(1 << 20);
  std::uint64_t offset = 0, line = 1, line_start = 0;
  bool line_has_text = false;
  xxh3_stream checksum;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    checksum.update(buffer.data(), got);
    for (std::size_t i = 0; i < got; ++i, ++offset) {
      const char c = buffer[i];
      if (c == '\n') {
        if (line_has_text) places.push_back({index, line_start, line});
        ++line;
        line_start = offset + 1;
        line_has_text = false;
      } else if (c != '\r' && c != ' ' && c != '\t') {
        line_has_text = true;
      }
    }
  }
  if (line_has_text) places.push_back({index, line_start, line});
  file.xxh3 = checksum.digest().xxh3;
}

std::string identity_of(std::span<const data_file* const> files) {
  std::vector<std::string> names;
  std::uintmax_t bytes = 0;
  xxh3_stream digest;
  for (const data_file* f : files) {
    const std::string name = f->path.filename().string();
    names.push_back(name);
    bytes += f->size;
    digest.update(name.data(), name.size() + 1);
    digest.update(&f->size, sizeof f->size);
    digest.update(&f->xxh3, sizeof f->xxh3);
  }
  return fmt::format("{} ({}, {} bytes, digest {:016x})", some_of(names),
                     counted(static_cast<std::int64_t>(files.size()), "file"), bytes, digest.digest().xxh3);
}

std::vector<std::uint64_t> shuffled_order(std::uint64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::vector<std::uint64_t> order(n);
  for (std::uint64_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 generator(seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(epoch) + 1);
  for (std::uint64_t i = n; i > 1; --i) {
    // An unbiased draw in [0, i): rejection above the largest multiple of i.
    const std::uint64_t limit =
        std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % i;
    std::uint64_t draw = generator();
    while (draw >= limit) draw = generator();
    std::swap(order[i - 1], order[draw % i]);
  }
  return order;
}

std::ifstream& file_reader::checked(const data_file& file, const line_place& place) {
  if (open_.size() <= place.file) open_.resize(place.file + 1);
  std::ifstream& in = open_[place.file];
  if (!in.is_open()) {
    in.open(file.path, std::ios::binary);
    if (!in) {
      throw_error<std::runtime_error>(
          "{}: {} cannot be read any more ({}), though it was there when the dataset was indexed: restore it, or "
          "start the run again on the data as it is now",
          who_, file.path.string(), fs::exists(file.path) ? "it cannot be opened" : "it is gone");
    }
  }
  std::error_code error;
  const std::uintmax_t size_now = fs::file_size(file.path, error);
  if (error || size_now < file.size) {
    throw_error<std::runtime_error>(
        "{}: {} was truncated while the run read it: it has {} bytes, and {} when it was indexed (line {} starts at "
        "byte {}): restore it, or start the run again on the data as it is now",
        who_, file.path.string(), error ? 0 : size_now, file.size, place.line, place.offset);
  }
  in.clear();
  in.seekg(static_cast<std::streamoff>(place.offset));
  return in;
}

std::string file_reader::line(const data_file& file, const line_place& place) {
  std::ifstream& in = checked(file, place);
  std::string text;
  std::getline(in, text);
  if (!text.empty() && text.back() == '\r') text.pop_back();
  return text;
}

nlohmann::json saved_state_of(std::string_view state, const nlohmann::json& fingerprint, std::string_view who) {
  nlohmann::json saved = nlohmann::json::parse(state, nullptr, /*allow_exceptions=*/false);
  if (saved.is_discarded() || !saved.is_object() || !saved.contains("dataset") || !saved["dataset"].is_object())
    throw_error<std::invalid_argument>("{}: the state to restore is not one {}::state() wrote", who, who);
  const nlohmann::json& theirs = saved["dataset"];
  for (const auto& [key, value] : fingerprint.items()) {
    if (!theirs.contains(key) || theirs[key] != value) {
      throw_error<std::invalid_argument>(
          "{}: the state is of another dataset: its \"{}\" is {}, this dataset's is {}: restore it with the files, "
          "options and ranks it was saved with",
          who, key, theirs.contains(key) ? theirs[key].dump() : "missing", value.dump());
    }
  }
  return saved;
}

}  // namespace loom::data::detail
