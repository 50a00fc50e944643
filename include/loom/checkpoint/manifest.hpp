#pragma once
// A checkpoint's manifest.json (docs/checkpoints.md): what it records (the plan, the schedule's
// fingerprint, the world size, the versions, the caller's state and every rank's file with its size
// and checksum), sealed by its own checksum, and its reader, which checks what it can without the job.

#include <loom/io/checksum.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace loom {

// What a checkpoint was trained over beside its plan: pretrained(...)'s weights and the data, each
// empty where the run had none; a resume onto others is refused unless the run allows it.
struct trained_over {
  std::string pretrained{};         // the path pretrained(...) read, for the messages
  std::string pretrained_digest{};  // their fingerprint's digest, 16 hexadecimal digits (compared)
  std::string data{};               // the data's identity (loom::data::text_dataset::identity(); compared)
};

// What a checkpoint's manifest.json records (docs/checkpoints.md).
struct checkpoint_manifest {
  std::int64_t step = 0;
  int world_size = 0;
  // Sharded: how many ranks' files hold one whole copy (ranks 0 to shard_group_size - 1); fewer than
  // world_size under hybrid sharding. A manifest without it was sharded across every rank.
  int shard_group_size = 0;
  bool sharded = false;
  // tensor_parallel's k: rank d·k + t holds slice t of each split tensor, of data-parallel rank d's
  // rows. A manifest without it split nothing.
  int tensor_parallel = 1;
  bool all_parameters = false;  // "all", or "trainable"
  std::string plan;
  std::string describe;
  std::string schedule_fingerprint;  // 16 hexadecimal digits
  // The collectives of a step, one line each (schedule_entry::to_string), so that a refused resume
  // can say which differs; empty in a manifest written before it was recorded.
  std::string schedule;
  std::string libtorch;
  std::string loom;
  std::string user_state;  // the JSON given to save()
  // None in a manifest written before loom recorded it.
  std::optional<trained_over> trained;
  // Each rank's file (rank-00000.safetensors, ...) with its size and checksum; `checksummed` is
  // false for a manifest written before checksums, which records sizes only.
  std::map<std::string, file_digest> files;
  bool checksummed = true;
};

// Reads the manifest of the checkpoint at `path` (a step-N folder) and checks what it can without
// the job: its own checksum, its fields, and that every rank's file it lists is there, of the size
// it lists. A manifest that fails is a checkpoint_error (loom/checkpoint/checkpoint.hpp) naming the
// checkpoint and its first problem.
[[nodiscard]] checkpoint_manifest read_checkpoint_manifest(const std::filesystem::path& path);

}  // namespace loom
