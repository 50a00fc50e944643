#pragma once
// The schedule at run time, for a strategy that issues its collectives itself (fsdp does; ddp's
// come from c10d's Reducer): each step issues the collectives it declared, in the declared order,
// and no others.
//
// In setup the strategy declares each collective (or a few entries issued together, one per dtype)
// with the function that issues it; the entries go into the schedule, so the order that build()
// checks across ranks is the order of issue. In a step the strategy asks for a declared collective
// by its index, and the cursor first issues every earlier one not issued yet: a hook that did not
// fire on one rank (a layer whose output this rank's loss did not use) delays that rank's
// collectives but never reorders them. A collective of a branch (loom/nn/branch.hpp) is issued in a
// pass that takes that branch and passed over in any other, as every rank takes the same one.

#include <loom/schedule/schedule.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom {

// How far a pass synchronises gradients, and so which of its collectives it issues: every pass
// issues the ones that need no more than it does. A gather is needed by every pass; under fsdp() a
// reduce-scatter by every backward but those that accumulate unsharded; an all-reduce of gradients
// across replicas (hybrid sharding's, the replicated adapters') only by the backward before the
// optimizer's step.
enum class gradient_sync : std::uint8_t {
  none,      // job.no_sync() keeping whole gradients: nothing reduced
  shards,    // job.no_sync() under fsdp(): gradients reduce-scattered into the shards, not yet across replicas
  replicas,  // every reduction: the backward before the optimizer's step
};

class schedule_cursor {
 public:
  using issue_fn = std::function<void()>;
  static constexpr std::size_t every_branch = static_cast<std::size_t>(-1);

  // Appends `entries` to `schedule`, issued together by `issue`, in a pass that synchronises at
  // least `needs` and, unless `branch` is every_branch, takes that branch (an index of the model's
  // branches); returns the index to ask for.
  std::size_t declare(collective_schedule& schedule, std::vector<schedule_entry> entries, issue_fn issue,
                      gradient_sync needs, std::size_t branch = every_branch);

  // The next step starts from the first declared collective, in no branch yet.
  void begin_step() noexcept {
    next_ = 0;
    taken_branch_ = every_branch;
    issued_entries_.clear();
  }
  // The pass takes `branch`: from here on the other branches' collectives are passed over, and so
  // are all of them until a branch is taken.
  void take_branch(std::size_t branch) noexcept { taken_branch_ = branch; }
  [[nodiscard]] std::size_t taken_branch() const noexcept { return taken_branch_; }
  // Issues, in order, every declared collective up to and including `index` not yet issued in this
  // step, of those a pass that synchronises `sync` needs in the branch it took; passes over the others.
  void issue_through(std::size_t index, gradient_sync sync);
  // Issues the rest of the step's collectives.
  void issue_rest(gradient_sync sync);
  [[nodiscard]] bool issued(std::size_t index) const noexcept { return index < next_; }

  // The schedule entries issued in this step, by index, in the order of issue: what a test compares
  // across ranks and runs.
  [[nodiscard]] const std::vector<std::size_t>& issued_entries() const noexcept { return issued_entries_; }

  // "entry #3 (all_gather forward, 1024 B: blocks.1.ln.weight ... blocks.1.mlp.bias)": its first
  // schedule entry, for messages.
  [[nodiscard]] const std::string& describe(std::size_t index) const { return declared_.at(index).text; }

 private:
  struct declared_collective {
    issue_fn issue;
    gradient_sync needs = gradient_sync::none;
    std::string text;
    std::size_t first_entry = 0;  // its entries' indices in the schedule
    std::size_t entries = 0;
    std::size_t branch = every_branch;
  };
  std::vector<declared_collective> declared_;
  std::size_t next_ = 0;
  std::size_t taken_branch_ = every_branch;
  std::vector<std::size_t> issued_entries_;
};

}  // namespace loom
