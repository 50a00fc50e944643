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
// collectives but never reorders them.

#include <loom/schedule/schedule.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace loom {

class schedule_cursor {
 public:
  using issue_fn = std::function<void()>;

  // Appends `entries` to `schedule`, issued together by `issue`; returns the index to ask for.
  // A gradient-sync collective (a reduce-scatter or all-reduce of gradients) is left out of a step
  // under no_sync.
  std::size_t declare(collective_schedule& schedule, std::vector<schedule_entry> entries, issue_fn issue,
                      bool gradient_sync);

  // The next step starts from the first declared collective.
  void begin_step() noexcept { next_ = 0; }
  // Issues, in order, every declared collective up to and including `index` not yet issued in this step.
  void issue_through(std::size_t index, bool sync_gradients);
  // Issues the rest of the step's collectives.
  void issue_rest(bool sync_gradients);
  [[nodiscard]] bool issued(std::size_t index) const noexcept { return index < next_; }

  // "entry #3 (all_gather forward, 1024 B: blocks.1.ln.weight ... blocks.1.mlp.bias)": its first
  // schedule entry, for messages.
  [[nodiscard]] const std::string& describe(std::size_t index) const { return declared_.at(index).text; }

 private:
  struct declared_collective {
    issue_fn issue;
    bool gradient_sync = false;
    std::string text;
  };
  std::vector<declared_collective> declared_;
  std::size_t next_ = 0;
};

}  // namespace loom
