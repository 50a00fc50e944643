// Which modules a stage applies to: names and regular expressions, in a list stored inline so that a
// plan stays a constexpr value.
#pragma once

#include <loom/dsl/diagnostics.hpp>

#include <array>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>

namespace loom {

enum class target_kind : unsigned char {
  name,        // a module whose dotted name equals it or ends with "." + it
  pattern,     // a regular expression that matches the whole dotted name
  all_linear,  // lora's: every linear layer but the model's output head (PEFT's "all-linear")
};

struct target {
  std::string_view text;
  target_kind kind = target_kind::name;

  constexpr target() noexcept = default;
  constexpr target(const char* name) noexcept : text(name) {}                             // NOLINT: {"q_proj", ...}
  constexpr target(std::string_view text, target_kind kind = target_kind::name) noexcept  // NOLINT
      : text(text), kind(kind) {}
  target(const std::string& name) noexcept : text(name) {}  // NOLINT: target_list copies the text

  friend constexpr bool operator==(const target&, const target&) = default;
};

// Another name that a model's users give one of its modules, which lora(...)'s targets may use:
// FastVideo's Wan names the attention's output projection `to_out`, where diffusers' Wan (and
// loom's, which keeps diffusers' names) has `to_out.0`, a linear layer in a list. A model declares
// them as `static constexpr std::array<loom::target_alias, N> lora_target_aliases`; a model without
// them refuses a target that selects a module which is not linear, as PEFT does.
struct target_alias {
  std::string_view alias;  // a target's text, or its end after a "."
  std::string_view name;   // the module it stands for, in the model's own names
};

// loom::pattern(".*attn\\.(q|v)") matches a module whose whole dotted name matches the regex.
constexpr target pattern(std::string_view regex) noexcept { return {regex, target_kind::pattern}; }

// lora(16, {loom::all_linear}): every linear layer but the output head, as PEFT's target_modules =
// "all-linear" (the head is the layer a model names as its `output_embeddings`, transformers'
// get_output_embeddings(); lm_head for loom::models::CausalLM). A whole target list by itself (R5).
inline constexpr target all_linear{"all-linear", target_kind::all_linear};

namespace detail {

// Text given at run time is copied here, so that a target_list built from run-time strings holds
// views that never dangle, like one built from literals. A process uses a handful of distinct names.
inline std::string_view intern(std::string_view text) {
  static std::mutex mutex;
  static std::set<std::string, std::less<>> texts;
  const std::scoped_lock lock(mutex);
  return *texts.emplace(text).first;
}

// A list stored inline (no heap), so that a plan stays a constexpr value: at most Capacity entries
// (the violation `full` past them), and each entry's text, given at run time, copied by intern().
template <class Entry, std::string_view Entry::*text, std::size_t Capacity, violation full>
class inline_list {
 public:
  static constexpr std::size_t capacity = Capacity;

  constexpr inline_list() noexcept = default;
  constexpr inline_list(std::initializer_list<Entry> entries) {
    for (const Entry& entry : entries) push_back(entry);
  }

  constexpr void push_back(Entry entry) {
    if (size_ == capacity) enforce(full);
    if (!std::is_constant_evaluated()) entry.*text = intern(entry.*text);
    entries_[size_++] = entry;
  }

  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }
  [[nodiscard]] constexpr bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] constexpr const Entry* begin() const noexcept { return entries_.data(); }
  [[nodiscard]] constexpr const Entry* end() const noexcept { return entries_.data() + size_; }
  [[nodiscard]] constexpr const Entry& operator[](std::size_t i) const noexcept { return entries_[i]; }

  friend constexpr bool operator==(const inline_list& a, const inline_list& b) noexcept {
    if (a.size_ != b.size_) return false;
    for (std::size_t i = 0; i != a.size_; ++i)
      if (!(a[i] == b[i])) return false;
    return true;
  }

 private:
  std::array<Entry, Capacity> entries_{};
  std::size_t size_ = 0;
};

}  // namespace detail

// R12 past 16 entries.
using target_list = detail::inline_list<target, &target::text, 16, violation::r12_too_many_targets>;

// The layers that PEFT and FastVideo adapt by default: attention projections under both spellings,
// and the gate of FastVideo's compressed attention (its DEFAULT_LORA_TARGET_MODULES).
inline constexpr target_list default_targets{"q_proj", "k_proj", "v_proj", "o_proj", "to_q",
                                             "to_k",   "to_v",   "to_out", "to_qkv", "to_gate_compress"};

namespace detail {

// The first empty or repeated entry of a list, as the given violation; none otherwise.
constexpr violation entries_violation(const target_list& list, violation empty, violation duplicate) noexcept {
  for (std::size_t i = 0; i != list.size(); ++i) {
    if (list[i].text.empty()) return empty;
    for (std::size_t j = 0; j != i; ++j)
      if (list[j] == list[i]) return duplicate;
  }
  return violation::none;
}

}  // namespace detail
}  // namespace loom
