#pragma once
// TinyGpt: a character-level GPT with the shapes and module names of ../shared/BENCHMARKS.md
// (tok, pos, blocks.<i>.{ln1, attn.{q,k,v,o}_proj, ln2, fc_in, fc_out}, ln_f, head).
// `Linear` is loom::nn::Linear (LoRA's fast path; with loom::nn::Embedding, a model that fsdp()
// constructs without the full replica) or torch::nn::Linear (LoRA's fallback; with torch::nn::Embedding,
// constructed whole).

#include <loom/nn/embedding.hpp>
#include <loom/nn/linear.hpp>
#include <loom/nn/unit.hpp>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

namespace models {

struct tiny_gpt_config {
  std::int64_t vocab = 128;
  std::int64_t d = 256;
  std::int64_t layers = 4;
  std::int64_t heads = 4;
  std::int64_t ctx = 128;
};

template <class Linear>
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(std::int64_t d, std::int64_t heads)
      : heads_(heads),
        q_proj(register_module("q_proj", Linear(d, d))),
        k_proj(register_module("k_proj", Linear(d, d))),
        v_proj(register_module("v_proj", Linear(d, d))),
        o_proj(register_module("o_proj", Linear(d, d))) {}

  at::Tensor forward(const at::Tensor& x) {
    const auto b = x.size(0), t = x.size(1), d = x.size(2);
    auto split = [&](const at::Tensor& y) { return y.view({b, t, heads_, d / heads_}).transpose(1, 2); };
    auto q = split(q_proj(x)), k = split(k_proj(x)), v = split(v_proj(x));
    auto att = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d / heads_));
    auto mask = torch::ones({t, t}, torch::TensorOptions(torch::kBool).device(q.device())).tril();
    att = att.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity()).softmax(-1);
    return o_proj(att.matmul(v).transpose(1, 2).reshape({b, t, d}));
  }

 private:
  std::int64_t heads_;

 public:
  Linear q_proj, k_proj, v_proj, o_proj;
};

template <class Linear>
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(std::int64_t d, std::int64_t heads)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        attn(register_module("attn", std::make_shared<AttentionImpl<Linear>>(d, heads))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        fc_in(register_module("fc_in", Linear(d, 4 * d))),
        fc_out(register_module("fc_out", Linear(4 * d, d))) {}

  at::Tensor forward(at::Tensor x) {
    x = x + attn->forward(ln1(x));
    return x + fc_out(torch::gelu(fc_in(ln2(x))));
  }

  torch::nn::LayerNorm ln1;
  std::shared_ptr<AttentionImpl<Linear>> attn;
  torch::nn::LayerNorm ln2;
  Linear fc_in, fc_out;
};

template <class Linear = loom::nn::Linear>
class BasicTinyGpt : public torch::nn::Module {
  using Embedding =
      std::conditional_t<std::is_same_v<Linear, loom::nn::Linear>, loom::nn::Embedding, torch::nn::Embedding>;

 public:
  explicit BasicTinyGpt(const tiny_gpt_config& config = {})
      : config(config),
        tok(register_module("tok", Embedding(config.vocab, config.d))),
        pos(register_module("pos", Embedding(config.ctx, config.d))),
        blocks(register_module("blocks", make_blocks(config))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.d})))),
        head(register_module("head", Linear(config.d, config.vocab))) {}

  at::Tensor logits(const at::Tensor& idx) {
    auto x = tok(idx) + pos(torch::arange(idx.size(1), idx.options()));
    for (auto& block : *blocks) x = block->as<Block>()->forward(x);
    return head(ln_f(x));
  }

  // The mean cross-entropy of the next-token predictions.
  at::Tensor forward(const at::Tensor& idx, const at::Tensor& targets) {
    auto out = logits(idx);
    return torch::nn::functional::cross_entropy(out.view({-1, out.size(-1)}), targets.view(-1));
  }

  // Each block is a unit of sharding under fsdp(), and a plain BlockImpl under local() and ddp().
  using Block = loom::nn::Unit<BlockImpl<Linear>>;

  tiny_gpt_config config;
  Embedding tok, pos;
  torch::nn::ModuleList blocks;  // built before ln_f and head, so a seed draws what PyTorch's draws
  torch::nn::LayerNorm ln_f;
  Linear head;

 private:
  static torch::nn::ModuleList make_blocks(const tiny_gpt_config& config) {
    torch::nn::ModuleList list;
    for (std::int64_t i = 0; i < config.layers; ++i) {
      list->push_back(std::make_shared<Block>(config.d, config.heads));
    }
    return list;
  }
};

using TinyGpt = BasicTinyGpt<loom::nn::Linear>;

}  // namespace models
