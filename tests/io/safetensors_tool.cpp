// The C++ side of safetensors_interop.py. Usage:
//   safetensors-tool write FILE   writes reference_tensors() and {"written_by": "loom"}
//   safetensors-tool read FILE    prints each tensor as "name dtype [shape] sum" and each metadata
//                                 entry as "meta key value", sorted
#include <loom/io/safetensors.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <set>
#include <string>

namespace {

// arange(12) as 3 × 4 in each dtype (booleans: its parity); the Python side builds the same.
std::vector<loom::named_tensor> reference_tensors() {
  std::vector<loom::named_tensor> tensors;
  const at::Tensor base = at::arange(12, at::kDouble).reshape({3, 4});
  for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble, at::kLong, at::kInt, at::kByte}) {
    tensors.push_back({"t_" + loom::safetensors_dtype(dtype), base.to(dtype)});
  }
  tensors.push_back({"t_BOOL", at::remainder(base, 2).to(at::kBool)});
  return tensors;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: safetensors-tool {write|read} FILE\n";
    return 2;
  }
  const std::string mode = argv[1];
  try {
    if (mode == "write") {
      loom::save_safetensors(argv[2], reference_tensors(), {{"written_by", "loom"}});
      return 0;
    }
    if (mode == "read") {
      const loom::safetensors_content content = loom::load_safetensors(argv[2]);
      std::set<std::string> lines;
      for (const loom::named_tensor& t : content.tensors) {
        lines.insert(fmt::format("{} {} [{}] {:g}", t.name, loom::safetensors_dtype(t.tensor.scalar_type()),
                                 fmt::join(t.tensor.sizes(), ","), t.tensor.to(at::kDouble).sum().item<double>()));
      }
      for (const auto& [key, value] : content.metadata) lines.insert(fmt::format("meta {} {}", key, value));
      for (const std::string& line : lines) std::cout << line << '\n';
      return 0;
    }
  } catch (const std::exception& error) {
    std::cerr << error.what() << '\n';
    return 1;
  }
  std::cerr << "usage: safetensors-tool {write|read} FILE\n";
  return 2;
}
