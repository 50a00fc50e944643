#include "error_files.hpp"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>

namespace loom::launcher {

error_files::error_files() {
  std::string folder = (std::filesystem::temp_directory_path() / "loom-run-XXXXXX").string();
  if (::mkdtemp(folder.data()) == nullptr) {
    throw std::system_error{errno, std::generic_category(), "creating a folder for the ranks' error files"};
  }
  folder_ = folder;
}

error_files::~error_files() {
  std::error_code ignored;
  std::filesystem::remove_all(folder_, ignored);
}

std::string error_files::path_of(int rank) const {
  return (folder_ / ("rank-" + std::to_string(rank) + ".txt")).string();
}

std::optional<found_at_fault> error_files::read(int rank) const {
  std::ifstream in(path_of(rank));
  found_at_fault found;
  if (!(in >> found.rank) || found.rank < 0) return std::nullopt;
  in >> std::ws;
  std::getline(in, found.error, '\0');
  while (!found.error.empty() && found.error.back() == '\n') found.error.pop_back();
  return found;
}

void error_files::clear() const {
  for (const auto& entry : std::filesystem::directory_iterator(folder_)) {
    std::error_code ignored;
    std::filesystem::remove(entry.path(), ignored);
  }
}

}  // namespace loom::launcher
