// A read the host-reads lint must find (tests/unit/meson.build: host-reads-lint-finds).
bool planted(const at::Tensor& flag) { return flag.item<bool>(); }
