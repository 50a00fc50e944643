#pragma once
// loom::nn::Branch<B>: marks a part of a model as one branch of a choice that a forward pass makes,
// the same on every rank: at most one of a model's branches runs in a pass (Wan 2.2 A14B's two
// experts, chosen by the timestep). Under fsdp() a pass issues the collectives of the branch it takes
// and passes over the others', and every rank checks, as it enters the branch, that every rank took
// the same one (docs/schedule.md, "Branches"). Hold the part as Branch<Part> and call it through that
// type:
//
//   transformer = register_module("transformer", std::make_shared<loom::nn::Branch<WanImpl>>(config));
//   return transformer->forward(latents, timestep, text);
//
// Branch<B> is a B: it takes B's constructor arguments and registers nothing of its own. Under local()
// it is transparent. A branch holds loom::nn::Units of its own (each unit in at most one branch).

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace loom::nn {

// What a strategy does as a pass enters a branch.
class branch_hooks {
 public:
  virtual ~branch_hooks() = default;
  virtual void enter_branch(std::size_t branch) = 0;
};

// The part of every Branch<B> that does not depend on B.
class branch_base {
 public:
  void attach(branch_hooks* hooks, std::size_t index) noexcept {
    hooks_ = hooks;
    index_ = index;
  }
  void detach() noexcept { hooks_ = nullptr; }

 protected:
  branch_base() = default;
  ~branch_base() = default;

  template <class Forward>
  decltype(auto) run(Forward&& forward) {
    if (hooks_) hooks_->enter_branch(index_);
    return std::forward<Forward>(forward)();
  }

 private:
  branch_hooks* hooks_ = nullptr;
  std::size_t index_ = 0;
};

// Each loom::nn::Branch in `model` (not the model itself), in registration order, by its dotted name.
// Throws std::invalid_argument naming a branch inside another.
struct branch_module {
  std::string name;
  branch_base* module = nullptr;
};
[[nodiscard]] std::vector<branch_module> find_branches(torch::nn::Module& model);

// The branch that holds the dotted name `name` (a parameter's or a unit's), as an index into
// `branches`; branches.size() when none does.
[[nodiscard]] std::size_t branch_of(const std::vector<branch_module>& branches, const std::string& name);

template <class B>
class Branch : public B, public branch_base {
 public:
  using B::B;

  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    return run([&]() -> decltype(auto) { return B::forward(std::forward<Args>(args)...); });
  }
};

}  // namespace loom::nn
