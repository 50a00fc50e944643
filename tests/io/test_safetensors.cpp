// loom's safetensors reader and writer: what it writes it reads back exactly, and every malformed
// file it is given is refused with the file's name and its first problem. (Python's safetensors
// reading loom's files and the reverse: safetensors_interop.py.)
#include <loom/io/files.hpp>
#include <loom/io/safetensors.hpp>

#include <ATen/ATen.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

using Catch::Matchers::ContainsSubstring;

namespace {

std::filesystem::path scratch(const std::string& name) {
  const auto folder = std::filesystem::temp_directory_path() / "loom-test-safetensors";
  std::filesystem::create_directories(folder);
  return folder / name;
}

// A file of an 8-byte little-endian header length, `header`, then `data` bytes of zeros.
std::filesystem::path crafted(const std::string& name, const std::string& header, std::size_t data,
                              std::uint64_t declared_length = 0) {
  const auto path = scratch(name);
  std::ofstream out(path, std::ios::binary);
  const std::uint64_t length = declared_length != 0 ? declared_length : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(length >> (8 * i)));
  out << header << std::string(data, '\0');
  return path;
}

void check_refused(const std::filesystem::path& path, const std::string& problem) {
  CAPTURE(path.filename().string());
  try {
    (void)loom::load_safetensors(path);
    FAIL("the file was accepted");
  } catch (const loom::safetensors_error& error) {
    CHECK_THAT(error.what(), ContainsSubstring("'" + path.string() + "'") && ContainsSubstring(problem));
  }
}

}  // namespace

TEST_CASE("safetensors round trip: dtypes, shapes, empty and 0-d tensors, metadata", "[safetensors]") {
  const std::vector<loom::named_tensor> tensors{
      {"weight", at::randn({3, 5})},
      {"half", at::randn({4}).to(at::kHalf)},
      {"bf16", at::randn({2, 2}).to(at::kBFloat16)},
      {"index", at::arange(7, at::kLong)},
      {"mask", at::rand({6}) > 0.5},
      {"scalar", at::full({}, 2.5, at::kDouble)},
      {"empty", at::empty({0, 3})},
      {"strided", at::randn({4, 6}).t()},  // not contiguous: written as its values
  };
  const auto path = scratch("round-trip.safetensors");
  loom::save_safetensors(path, tensors, {{"format", "pt"}, {"step", "12"}});
  const loom::safetensors_content content = loom::load_safetensors(path);
  REQUIRE(content.tensors.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CAPTURE(tensors[i].name);
    CHECK(content.tensors[i].name == tensors[i].name);
    CHECK(content.tensors[i].tensor.scalar_type() == tensors[i].tensor.scalar_type());
    CHECK(at::equal(content.tensors[i].tensor, tensors[i].tensor));
  }
  CHECK(content.metadata == std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}});
  CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp"));
}

TEST_CASE("saving refuses a name given twice and a dtype safetensors lacks", "[safetensors]") {
  CHECK_THROWS_WITH(loom::save_safetensors(scratch("twice.safetensors"), {{"a", at::zeros({1})}, {"a", at::ones({1})}}),
                    ContainsSubstring("the tensor name 'a' is given twice"));
  CHECK_THROWS_WITH(loom::save_safetensors(scratch("complex.safetensors"), {{"z", at::zeros({1}, at::kComplexFloat)}}),
                    ContainsSubstring("safetensors has no dtype for ComplexFloat"));
}

TEST_CASE("a malformed safetensors file is refused, naming the file and its first problem", "[safetensors]") {
  const std::string one = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  check_refused(crafted("short-data.safetensors", one, 4),
                "tensor 'a' ends at byte 8, past the end of the data (4 bytes)");
  check_refused(crafted("long-data.safetensors", one, 12),
                "its tensors hold 8 bytes, but 12 bytes of data follow the header");
  {
    const auto path = scratch("tiny.safetensors");
    std::ofstream(path, std::ios::binary) << "abc";
    check_refused(path, "it is 3 bytes long, shorter than the 8-byte header length");
  }
  check_refused(crafted("long-header.safetensors", one, 8, 1'000'000), "its header length is 1000000 bytes");
  check_refused(crafted("not-json.safetensors", "{\"a\": [", 0), "its header is not JSON");
  check_refused(crafted("array.safetensors", "[1, 2]", 0), "its header is not a JSON object");
  check_refused(crafted("twice.safetensors",
                        R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        8),
                "its header names 'a' twice");
  check_refused(crafted("dtype.safetensors", R"({"a":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", 4),
                "tensor 'a': its dtype 'F31' is not one loom knows");
  check_refused(crafted("size.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                "tensor 'a': its data_offsets [0, 8] hold 8 bytes, but F32[3] needs 12");
  check_refused(crafted("negative.safetensors", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
                "tensor 'a': its shape holds something other than a non-negative integer");
  check_refused(
      crafted("huge.safetensors", R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
      "tensor 'a': its shape is too large");
  // An empty tensor whose strides overflow: LibTorch's at::empty threw its own c10::Error (a seed the
  // fuzzer's corpus starts from: tests/fuzz/corpus/safetensors/zero-dim-wide).
  check_refused(crafted("wide-empty.safetensors",
                        R"({"a":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})", 0),
                "tensor 'a': its shape is too large");
  check_refused(crafted("backwards.safetensors", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4),
                "end before they begin");
  check_refused(crafted("overlap.safetensors",
                        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        8),
                "tensor 'b' (bytes [4, 8]) overlaps the tensor before it, which ends at byte 8");
  check_refused(crafted("gap.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                "4 bytes that no tensor holds lie before tensor 'a'");
  check_refused(crafted("past-end.safetensors", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
                "tensor 'a' ends at byte 16, past the end of the data (8 bytes)");
  check_refused(crafted("negative-offset.safetensors", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[-1,3]}})", 4),
                "its data_offsets are not two non-negative integers");
  check_refused(crafted("offsets.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4),
                "its data_offsets are not two numbers");
  check_refused(crafted("metadata.safetensors", R"({"__metadata__":{"step":3}})", 0),
                "its __metadata__ value for 'step' is not a string");
  CHECK_THROWS_AS(loom::load_safetensors(scratch("missing.safetensors")), loom::file_error);
}

TEST_CASE("a truncated file is refused, not over-read", "[safetensors]") {
  const auto path = scratch("truncated.safetensors");
  loom::save_safetensors(path, {{"a", at::randn({64})}, {"b", at::randn({8, 8})}});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 1);
  check_refused(path, "tensor 'b' ends at byte 512, past the end of the data (511 bytes)");
}
