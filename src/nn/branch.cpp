#include <loom/nn/branch.hpp>

#include <loom/base/text.hpp>

#include <torch/nn/module.h>

#include <stdexcept>

namespace loom::nn {

std::vector<branch_module> find_branches(torch::nn::Module& model) {
  std::vector<branch_module> branches;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* branch = dynamic_cast<branch_base*>(item.value().get());
    if (branch == nullptr) continue;
    if (const std::size_t outer = branch_of(branches, item.key()); outer < branches.size()) {
      throw_error<std::invalid_argument>(
          "loom::nn::Branch '{}' is inside branch '{}': branches choose between parts of a model, one a pass, and "
          "cannot nest; make the inner part a plain module",
          item.key(), branches[outer].name);
    }
    branches.push_back({item.key(), branch});
  }
  return branches;
}

std::size_t branch_of(const std::vector<branch_module>& branches, const std::string& name) {
  for (std::size_t b = 0; b < branches.size(); ++b) {
    const std::string& prefix = branches[b].name;
    if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 && name[prefix.size()] == '.') {
      return b;
    }
  }
  return branches.size();
}

}  // namespace loom::nn
