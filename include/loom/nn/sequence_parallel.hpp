#pragma once
// Where a model meets sequence_parallel(k) (docs/sequence_parallel.md): two parameterless modules a
// model registers, which build() finds in the module tree and joins to the plan's sequence group.
//
// - loom::nn::Attention: scaled dot-product attention over q, k, v of this rank's tokens. Under
//   sequence_parallel(k) an all-to-all first trades the split sequence for split heads (each rank
//   then holds every token of H / k heads), attention runs over the whole sequence, and a second
//   all-to-all trades back (DeepSpeed-Ulysses); their backward is the reverse all-to-all. Without
//   the stage it is plain attention.
// - loom::nn::Sequence: where the model's sequence is split (`split`, at the input; `local` for what
//   every rank computes whole, such as positions or labels), joined (`whole`) and its per-token sums
//   added up over the group (`sum`, for a loss). Without the stage each is the identity.
//
// A plan with sequence_parallel builds only a model with at least one of each (the build names the
// fix otherwise), and checks that k divides every Attention's heads.

#include <loom/runtime/tensors.hpp>
#include <loom/schedule/schedule.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {
class sequence_group;
}

namespace loom::nn {

// What one attention computes: its heads, key-value heads (fewer for grouped-query attention, each
// serving heads / kv_heads query heads in order), their size, and whether it is causal.
struct attention_options {
  std::int64_t heads = 1;
  std::int64_t kv_heads = 0;  // 0: as many as heads
  std::int64_t head_dim = 64;
  bool causal = false;
  std::optional<double> scale;      // none: 1 / sqrt(head_dim)
  std::int64_t sliding_window = 0;  // causal only: > 0, each query sees this many tokens, itself the last

  [[nodiscard]] std::int64_t key_value_heads() const noexcept { return kv_heads == 0 ? heads : kv_heads; }
};

// A packed batch's documents as attention takes them (docs/models.md, "Packed batches"), made once a
// forward rather than by every layer: each token's document, for the block-diagonal mask, and the
// same in flash attention's variable-length form, for ATen's kernel on CUDA: where each document
// starts in the batch's tokens laid end to end (cu_seqlens) and the longest's length.
struct packed_documents {
  at::Tensor ids;            // [batch, tokens] int64: each token's document, numbered within its row
  at::Tensor offsets;        // [documents + 1] int32: each document's first token, then the batch's tokens
  std::int64_t longest = 0;  // tokens in the longest document

  // A recomputed unit copies it and passes it again as it is (loom/nn/unit.hpp): nothing in it is
  // differentiated.
  using constant_input = void;

  // From positions [batch, tokens] that restart at 0 where a document starts (a row's first token
  // starts one whatever its position), on `device`. The positions are read on the host, where a
  // batch's come from: from a device they cost one copy back.
  [[nodiscard]] static packed_documents from_positions(const at::Tensor& positions, c10::Device device);
};

// The tokens [begin, end) of a whole sequence that this rank keeps.
struct token_range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  [[nodiscard]] std::int64_t size() const noexcept { return end - begin; }
};

// The plan's sequence group as the model's Attention and Sequence modules use it, made by build()
// for a plan with sequence_parallel(k), k > 1. It declares each attention's all-to-alls in the
// collective schedule (their bytes per token of this rank's sequence) and checks every all-to-all a
// step issues against them, in order, before it is issued.
class sequence_split {
 public:
  // One attention of the model, as build() finds it: its module's name, its options, and whether
  // its unit recomputes its forward in backward.
  struct site {
    std::string name;
    attention_options options;
    std::string unit;         // the unit it is in; empty when none
    bool recomputed = false;  // whether that unit recomputes its forward in backward
  };

  // Throws std::invalid_argument naming the fix when k does not divide a site's heads.
  sequence_split(std::shared_ptr<sequence_group> group, std::vector<site> sites, at::ScalarType compute_type);
  ~sequence_split();
  sequence_split(const sequence_split&) = delete;
  sequence_split& operator=(const sequence_split&) = delete;

  [[nodiscard]] const sequence_group& group() const noexcept { return *group_; }
  [[nodiscard]] int size() const noexcept;
  [[nodiscard]] int rank() const noexcept;

  // The all-to-alls of a step, in the order a forward and then its backward issue them.
  [[nodiscard]] std::vector<schedule_entry> schedule_entries() const;

  // A forward starts from the first declared all-to-all; its backward from the first of backward.
  void begin_forward();
  void begin_backward();

  // The batch and sequence length a forward splits, agreed across the group (one all-gather of two
  // numbers, on the host): throws on every rank when the ranks of a group were given batches of other
  // shapes, and when k does not divide `length`.
  void agree_on_length(std::int64_t batch, std::int64_t length);

  // Which exchange of an attention: q, k and v into split heads, or the result back into the split sequence.
  enum class exchange : std::uint8_t { to_heads, to_sequence };
  // `input` [k, ...] all-to-all over the group into `output`, after checking that it is one the step
  // declared: the site's `what`, in forward, in a recomputation (a forward inside backward) or in
  // backward (the exchange that reverses `what`). A forward issues its all-to-alls in the declared
  // order; a backward may pass over some (those of attentions no gradient reaches), never go back.
  void all_to_all(std::size_t site_index, exchange what, bool backward, const at::Tensor& input, at::Tensor& output);

  [[nodiscard]] const std::vector<site>& sites() const noexcept { return sites_; }
  [[nodiscard]] std::int64_t kv_heads_sent(std::size_t site_index) const;

 private:
  struct declared {
    std::size_t site_index;
    exchange what;
    step_phase phase;
    schedule_entry entry;
  };
  [[nodiscard]] std::string describe(std::size_t site_index, exchange what, step_phase phase) const;
  void declare(std::size_t site_index, exchange what, step_phase phase);

  std::shared_ptr<sequence_group> group_;
  std::vector<site> sites_;
  at::ScalarType compute_type_;
  std::vector<declared> declared_;
  std::size_t forward_count_ = 0;
  std::size_t next_ = 0;
  bool in_backward_ = false;
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const attention_options& options);

  // q [batch, tokens, heads, head_dim], k and v [batch, tokens, kv_heads, head_dim], of this rank's
  // tokens: the attended values [batch, tokens, heads, head_dim], computed in q's dtype. With
  // `documents` (of the whole sequence, the same on every rank of a sequence group), the sequences are
  // packed: a query attends only to keys of its own document. On the CPU, and for dtypes or head
  // sizes flash attention does not take, that is a block-diagonal mask with the causal and
  // sliding-window ones, through SDPA; on CUDA in fp16 or bf16 (autocast's included), ATen's
  // variable-length flash kernel over the documents laid end to end, no mask made.
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<packed_documents>& documents = std::nullopt);

  [[nodiscard]] const attention_options& options() const noexcept { return options_; }
  // Set by build(): the plan's split and this attention's place in it.
  void join(std::shared_ptr<sequence_split> split, std::size_t site_index);
  // Set by build() under tensor_parallel(k): this rank attends with heads / k and kv_heads / k, its
  // slice of them (throws std::invalid_argument naming `name` when k divides either not).
  void keep_heads(int k, std::string_view name);

 private:
  attention_options options_;
  std::shared_ptr<sequence_split> split_;
  std::size_t site_index_ = 0;
};
TORCH_MODULE(Attention);

class SequenceImpl : public torch::nn::Module {
 public:
  // A whole sequence's `dim` (every rank of the group holds the same one) down to this rank's part:
  // where the model enters the split. The ranks of the group agree on the batch's shape first.
  at::Tensor split(const at::Tensor& whole, std::int64_t dim);
  // This rank's part of a tensor every rank computes whole (rotary tables, labels): no collective.
  [[nodiscard]] at::Tensor local(const at::Tensor& whole, std::int64_t dim) const;
  // The whole sequence on every rank, from each rank's part along `dim`: an all-gather, whose
  // backward reduce-scatters the gradient.
  at::Tensor whole(const at::Tensor& part, std::int64_t dim);
  // `part` summed over the group (a loss's per-token sum), in forward and backward.
  at::Tensor sum(const at::Tensor& part);
  // The tokens [begin, end) this rank keeps of a sequence of `length`.
  [[nodiscard]] token_range tokens(std::int64_t length) const;
  // The ranks one sequence is split across: 1 without sequence_parallel.
  [[nodiscard]] int size() const noexcept;

  void join(std::shared_ptr<sequence_split> split);

 private:
  std::shared_ptr<sequence_split> split_;
};
TORCH_MODULE(Sequence);

// Where build() joins the model to the plan's split: every Attention, with the sites the split
// declares, and every Sequence.
struct sequence_modules {
  std::vector<std::pair<std::string, AttentionImpl*>> attentions;  // by name, in registration order
  std::vector<SequenceImpl*> sequences;
};
[[nodiscard]] sequence_modules find_sequence_modules(torch::nn::Module& model);

}  // namespace loom::nn
