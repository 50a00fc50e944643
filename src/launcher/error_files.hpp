#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace loom::launcher {

// What a rank's hang check wrote before it stopped the job: the rank it found at fault, and why.
struct found_at_fault {
  int rank = 0;
  std::string error;
};

// One file a rank (LOOM_ERROR_FILE, as torchrun gives TORCHELASTIC_ERROR_FILE), in a folder of the
// launcher's own that goes with it: the first rank to fail may only have found another at fault (a
// stopped peer), and the last line names the one it found. The format is the rank's number on the
// first line, then the error (loom/runtime/launch_env.hpp, `error_file`).
class error_files {
 public:
  error_files();
  ~error_files();
  error_files(const error_files&) = delete;
  error_files& operator=(const error_files&) = delete;

  [[nodiscard]] std::string path_of(int rank) const;
  // What `rank` wrote in this attempt, if anything readable.
  [[nodiscard]] std::optional<found_at_fault> read(int rank) const;
  // Before an attempt: nothing of an earlier one is read as this one's.
  void clear() const;

 private:
  std::filesystem::path folder_;
};

}  // namespace loom::launcher
