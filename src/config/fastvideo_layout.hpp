#pragma once
// FastVideo's YAML layout read as loom's run-file tree (src/config, not public; docs/run_files.md).
// FastVideo users write the strategy under training.distributed and a LoRA block per model role;
// loom reads their files as they are written by translating that layout once, right after the YAML
// is parsed, so that the overrides, the checks and the plan after it know one layout, loom's, while
// a message still names a key as the file spells it, on the line it was written on.

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace loom::config_detail {

// What the translation asks of the run-file reader (src/config/run_file.cpp): its checks, whose
// run_file_errors name the file, the key's line and the key as the file writes it; its notes; and its
// record of where each key was written.
class fastvideo_reader {
 public:
  virtual ~fastvideo_reader() = default;

  [[noreturn]] virtual void fail(const std::string& key, const std::string& problem) const = 0;
  // The keys of `value` are all `stage`'s, named as `prefix`.key in the message.
  virtual void require_keys(std::string_view stage, const std::vector<std::string>& keys,
                            const nlohmann::ordered_json& value, const std::string& prefix) const = 0;
  virtual bool boolean(const std::string& key, const nlohmann::ordered_json& value) const = 0;
  virtual void check_plan(const nlohmann::ordered_json& list) const = 0;
  // Something about the file that was accepted but that a user should hear of once (run_file::notes).
  virtual void note(const std::string& text) = 0;
  // The lines noted for `from` and its keys, now under `to`, and `from` the spelling messages use.
  virtual void move_lines(const std::string& from, const std::string& to) = 0;
  // The file is written for `ranks` ranks, as `asked_by` says ("hsdp_replicate_dim 2 × hsdp_shard_dim 2"),
  // written at `key`; `sizes` names the keys ("hsdp_replicate_dim × hsdp_shard_dim"), for
  // check_world_size's sentence.
  virtual void require_ranks(int ranks, const std::string& key, const std::string& asked_by,
                             const std::string& sizes) = 0;
};

// FastVideo's layout, as loom's: `training` is `train` (the loop's options) with
// `distributed.strategy` becoming the plan's strategy stage, last (FastVideo's hybrid sharding,
// hsdp_replicate_dim × hsdp_shard_dim, is fsdp's shard_group_size, and the ranks the file asks for;
// sp_size and tp_size are sequence_parallel and tensor_parallel, before lora), `training.model` (the
// timestep density) and the role's `flow_shift` becoming `flow_matching`, and a LoRA block of
// `models.<role>` ({enable, rank, alpha, target_modules}, as FastVideo's LoraConfig reads it)
// becoming a lora stage, before the plan's trainable or strategy stage if it has one. FastVideo's
// trainer's blocks map too: init_from (pretrained), training.data (data, seeded), training.optimizer
// (train.lr, optimizer), training.loop and training.checkpoint (train), callbacks (train.clip_norm,
// ema, train.eval_every, sampling) and pipeline.flow_shift (sampling.shift); the keys loom reads
// without effect are notes, the others it refuses naming them (docs/run_files.md, "FastVideo's
// keys"). The keys keep the lines they were written on.
void translate_fastvideo(nlohmann::ordered_json& root, fastvideo_reader& reader);

}  // namespace loom::config_detail
