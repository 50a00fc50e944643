// A program outside loom's tree, built with nothing but `pkg-config --cflags --libs loom`.
#include <loom/runtime/runtime.hpp>

#include <ATen/ATen.h>

#include <iostream>

int main() {
  auto rt = loom::runtime::single_process();
  auto tensor = at::arange(4, at::kFloat);
  rt.comm().all_reduce(tensor).wait();
  std::cout << "consumer: world " << rt.world_size() << ", sum " << tensor.sum().item<float>() << '\n';
  return tensor.sum().item<float>() == 6.0f ? 0 : 1;
}
