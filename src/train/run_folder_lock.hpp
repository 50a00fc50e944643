#pragma once
// The lock that keeps a second job out of a run folder (docs/training.md, "One job a run folder"):
// out/loom.lock, a JSON file naming its holder (host, pid, the process's start, when it was taken,
// and the job: its rendezvous and ranks). Rank 0 takes it for the whole job before anything in the
// folder is touched, and the ranks agree on the outcome (run_on_rank_zero); a lock whose holder is
// on this host and no longer runs is taken over, saying so. Private to loom::train.

#include <filesystem>
#include <string>

namespace loom {

class run_folder_lock {
 public:
  // Takes the lock of `folder`, which exists, for this process, as rank 0 of `job` (how messages name
  // it). Throws std::runtime_error naming the holder and what to do when another process holds it
  // that runs, or that runs on another host, where whether it runs cannot be seen.
  run_folder_lock(std::filesystem::path folder, std::string job);
  // Removes the file, unless another process has taken it over since.
  ~run_folder_lock();
  run_folder_lock(const run_folder_lock&) = delete;
  run_folder_lock& operator=(const run_folder_lock&) = delete;

  [[nodiscard]] static constexpr const char* file_name() noexcept { return "loom.lock"; }

 private:
  std::filesystem::path file_;
  std::string mine_;  // the file's text as this process wrote it
};

}  // namespace loom
