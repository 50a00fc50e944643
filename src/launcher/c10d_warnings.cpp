#include "c10d_warnings.hpp"

#include <cctype>

namespace loom::launcher {
namespace {

bool digits(std::string_view text) {
  if (text.empty()) return false;
  for (const char c : text)
    if (std::isdigit(static_cast<unsigned char>(c)) == 0) return false;
  return true;
}

// c10's log prefix, "[<I|W|E><MMDD> <HH:MM:SS.fraction> <file>:<line>] ", then c10d's "[c10d".
bool starts_c10d_record(std::string_view line) {
  if (line.size() < 2 || line[0] != '[' || (line[1] != 'W' && line[1] != 'E')) return false;
  const std::size_t space = line.find(' ');
  if (space == std::string_view::npos || !digits(line.substr(2, space - 2))) return false;
  const std::size_t close = line.find("] ", space);
  return close != std::string_view::npos && line.substr(close + 2).starts_with("[c10d");
}

bool continues_record(std::string_view line) {
  return line.empty() || line.starts_with("Exception raised from ") || line.starts_with("frame #");
}

}  // namespace

bool c10d_warning_filter::matches(std::string_view line) {
  in_record_ = starts_c10d_record(line) || (in_record_ && continues_record(line));
  if (in_record_) ++matched_;
  return in_record_;
}

}  // namespace loom::launcher
