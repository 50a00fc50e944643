#pragma once
// loom::models::Wan: the Wan 2.1 text-to-video transformer as diffusers' WanTransformer3DModel
// defines it, with its module and parameter names (patch_embedding, condition_embedder.time_embedder,
// blocks.<i>.attn1.to_q, ..., blocks.<i>.ffn.net.0.proj, scale_shift_table, proj_out), so that a
// diffusers checkpoint loads by name (pretrained(...)) and LoRA targets (to_q, to_k, to_v, to_out.0)
// line up with no renaming; FastVideo's `to_out` is taken for `to_out.0` (lora_target_aliases). Each
// transformer block is a loom::nn::Unit: a unit of sharding under fsdp() and of recompute(...).
// docs/models.md.
//
//   const std::string folder = "Wan2.1-T2V-1.3B-Diffusers/transformer/";
//   const auto config = loom::models::wan_config::from_pretrained(folder);
//   auto job = loom::build(loom::model<loom::models::Wan>(config) | loom::pretrained(folder) | loom::fsdp(), rt);
//   const at::Tensor velocity = job.forward(latents, timestep, text);  // [B, C, F, H, W], [B], [B, L, text_dim]
//
// What diffusers keeps in fp32 (_keep_in_fp32_modules: the time embedder, the scale-shift tables, the
// affine cross-attention norm) is constructed in fp32 whatever default_dtype(...) says, and loads the
// checkpoint's values in fp32; the forward computes the norms, the modulation and the gated residuals
// in fp32 and casts back where diffusers does, so a model built in bf16 computes as diffusers'
// from_pretrained(torch_dtype=torch.bfloat16) does (a base built in bf16 is frozen under lora(...):
// without it default_dtype(...) holds what trains in fp32). Under fsdp() with mixed_precision() every
// parameter, these too, is gathered in the policy's dtype (as FSDP2 with one policy for the model
// gathers them), and a floating timestep is cast with the other inputs (cast_forward_inputs): give
// integer timesteps there.

#include <loom/dsl/targets.hpp>
#include <loom/nn/linear.hpp>
#include <loom/nn/sequence_parallel.hpp>
#include <loom/nn/tensor_parallel.hpp>
#include <loom/nn/unit.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::models {

// config.json's keys, under diffusers' names and defaults (WanTransformer3DModel's __init__).
struct wan_config {
  std::array<std::int64_t, 3> patch_size{1, 2, 2};  // frames, height, width
  std::int64_t num_attention_heads = 40;
  std::int64_t attention_head_dim = 128;
  std::int64_t in_channels = 16;
  std::int64_t out_channels = 16;  // in_channels when config.json gives null
  std::int64_t text_dim = 4096;
  std::int64_t freq_dim = 256;
  std::int64_t ffn_dim = 13824;
  std::int64_t num_layers = 40;
  bool cross_attn_norm = true;
  std::string qk_norm = "rms_norm_across_heads";
  double eps = 1e-6;
  // Image conditioning (Wan 2.1 I2V, FLF2V): refused when set.
  std::optional<std::int64_t> image_dim;
  std::optional<std::int64_t> added_kv_proj_dim;
  std::int64_t rope_max_seq_len = 1024;
  std::optional<std::int64_t> pos_embed_seq_len;  // read by the image embedder alone

  [[nodiscard]] std::int64_t inner_dim() const noexcept { return num_attention_heads * attention_head_dim; }

  // Reads `folder`/config.json (or a config.json path). Throws std::invalid_argument in one sentence
  // naming the file and the key: another _class_name, a missing key among those without a default, a
  // value of the wrong type, image conditioning (image_dim, added_kv_proj_dim), a qk_norm other than
  // rms_norm_across_heads, an odd attention_head_dim (the rotary embedding rotates pairs).
  [[nodiscard]] static wan_config from_pretrained(const std::filesystem::path& path);
  // The same from config.json's text; `source` names it in the messages.
  [[nodiscard]] static wan_config from_json(std::string_view text, const std::string& source);
};

// Conv3d(in_channels, inner_dim, kernel_size = stride = patch_size) as diffusers' patch_embedding,
// its parameters made through loom::nn's deferred records (and drawn as torch::nn::Conv3d draws them),
// so that a sharding engine can construct it without its bytes.
class WanPatchEmbeddingImpl : public torch::nn::Module {
 public:
  WanPatchEmbeddingImpl(std::int64_t in_channels, std::int64_t out_channels, std::array<std::int64_t, 3> patch_size);
  // [B, C, F, H, W] -> [B, inner_dim, F / p_t, H / p_h, W / p_w] (remainders dropped, as a strided
  // convolution drops them).
  at::Tensor forward(const at::Tensor& latents);

  at::Tensor weight, bias;

 private:
  std::array<std::int64_t, 3> patch_size_;
};
TORCH_MODULE(WanPatchEmbedding);

// torch.nn.RMSNorm(size, eps) with its weight: queries' and keys' norms, across all heads at once.
// Under tensor_parallel it takes the colwise style of the projection before it: each rank keeps its
// slice of the weight and normalises its slice of the features by the mean square over all of them,
// its sum of squares summed over the group.
class WanRMSNormImpl : public torch::nn::Module, public loom::nn::parallel_module {
 public:
  WanRMSNormImpl(std::int64_t size, double eps);
  at::Tensor forward(const at::Tensor& x);

  [[nodiscard]] std::optional<cut> cut_by(loom::nn::parallel_style style) const override;
  std::vector<loom::nn::split_parameter> split(loom::nn::parallel_style style,
                                               std::shared_ptr<loom::nn::tensor_split> split) override;

  at::Tensor weight;

 private:
  double eps_;
  std::shared_ptr<loom::nn::tensor_split> split_;  // under tensor_parallel; else none
};
TORCH_MODULE(WanRMSNorm);

// diffusers' FP32LayerNorm with its affine weight and bias (the cross-attention's norm2), held and
// computed in fp32, returned in x's dtype.
class WanFP32LayerNormImpl : public torch::nn::Module {
 public:
  WanFP32LayerNormImpl(std::int64_t size, double eps);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight, bias;

 private:
  double eps_;
};
TORCH_MODULE(WanFP32LayerNorm);

// WanAttention without image keys: queries from x, keys and values from `context` (x itself for
// self-attention), each projection with a bias, queries and keys RMS-normalised across heads.
class WanAttentionImpl : public torch::nn::Module {
 public:
  // Self-attention (over the video's tokens, which sequence_parallel splits) or cross-attention (to
  // the text, whole on every rank).
  enum class kind : bool { self, cross };
  WanAttentionImpl(std::int64_t dim, std::int64_t heads, double eps, kind attends);
  // Attention of x [B, S, dim] over context [B, L, dim]; the rotary embedding's cos and sin
  // [S, head_dim / 2] (fp32) turn queries and keys when given (self-attention).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& cos = {},
                     const at::Tensor& sin = {});

  loom::nn::Linear to_q, to_k, to_v;
  torch::nn::ModuleList to_out;  // to_out.0: out_proj (diffusers' to_out.1 is a dropout of 0)
  loom::nn::Linear out_proj;
  WanRMSNorm norm_q, norm_k;
  loom::nn::Attention attention{nullptr};  // self-attention's: no weights; none for cross-attention

 private:
  std::int64_t head_dim_;
};
TORCH_MODULE(WanAttention);

// diffusers' GELU(dim, ffn_dim, approximate="tanh"): gelu_tanh(proj(x)).
class WanGELUImpl : public torch::nn::Module {
 public:
  WanGELUImpl(std::int64_t dim, std::int64_t ffn_dim);
  at::Tensor forward(const at::Tensor& x);

  loom::nn::Linear proj;
};
TORCH_MODULE(WanGELU);

// FeedForward(dim, inner_dim=ffn_dim, activation_fn="gelu-approximate"): net.2(net.0(x)), where
// diffusers' net.1 is a dropout of 0 that holds no parameter.
class WanFeedForwardImpl : public torch::nn::Module {
 public:
  WanFeedForwardImpl(std::int64_t dim, std::int64_t ffn_dim);
  at::Tensor forward(const at::Tensor& x);

  std::shared_ptr<torch::nn::Module> net;  // the two below, as "0" and "2"
  WanGELU project_in;
  loom::nn::Linear project_out;
};
TORCH_MODULE(WanFeedForward);

class WanTransformerBlockImpl : public torch::nn::Module {
 public:
  explicit WanTransformerBlockImpl(const wan_config& config);
  // x [B, S, dim] after self-attention (modulated and gated by timestep_proj [B, 6, dim], or
  // [B, S, 6, dim] a token's own, and the block's scale_shift_table), cross-attention to text
  // [B, L, dim] and the feed-forward (modulated and gated); cos and sin are the rotary embedding's.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& text, const at::Tensor& timestep_proj,
                     const at::Tensor& cos, const at::Tensor& sin);

  WanAttention attn1, attn2;
  WanFP32LayerNorm norm2{nullptr};  // none without cross_attn_norm
  WanFeedForward ffn;
  at::Tensor scale_shift_table;  // fp32 [1, 6, dim]

 private:
  double eps_;
};
using WanTransformerBlock = loom::nn::Unit<WanTransformerBlockImpl>;

// TimestepEmbedding (linear_1, silu, linear_2), constructed in fp32 and computing in its weights' dtype.
class WanTimeEmbedderImpl : public torch::nn::Module {
 public:
  WanTimeEmbedderImpl(std::int64_t freq_dim, std::int64_t dim);
  at::Tensor forward(const at::Tensor& x);

  loom::nn::Linear linear_1, linear_2;
};
TORCH_MODULE(WanTimeEmbedder);

// PixArtAlphaTextProjection(text_dim, dim, act_fn="gelu_tanh"): linear_1, gelu tanh, linear_2.
class WanTextEmbedderImpl : public torch::nn::Module {
 public:
  WanTextEmbedderImpl(std::int64_t text_dim, std::int64_t dim);
  at::Tensor forward(const at::Tensor& text);

  loom::nn::Linear linear_1, linear_2;
};
TORCH_MODULE(WanTextEmbedder);

// WanTimeTextImageEmbedding without the image: the timestep's sinusoids (cos first, no frequency
// shift), its embedding and the six modulations of every block, and the text's projection.
class WanConditionEmbedderImpl : public torch::nn::Module {
 public:
  explicit WanConditionEmbedderImpl(const wan_config& config);
  struct embedded {
    at::Tensor temb;           // [B, dim], or [B, S, dim] for per-token timesteps; in text's dtype
    at::Tensor timestep_proj;  // [B, 6, dim], or [B, S, 6, dim]
    at::Tensor text;           // [B, L, dim]
  };
  // For a timestep a sample [B], or a timestep a token [B, S] (Wan 2.2 TI2V's expand_timesteps).
  embedded forward(const at::Tensor& timestep, const at::Tensor& text);

  WanTimeEmbedder time_embedder;
  loom::nn::Linear time_proj;
  WanTextEmbedder text_embedder;

 private:
  std::int64_t freq_dim_;
};
TORCH_MODULE(WanConditionEmbedder);

// WanTransformer3DModel for text-to-video.
class WanImpl : public torch::nn::Module {
 public:
  // What a saved adapter tells diffusers and PEFT: the pipeline's name for this model, under which
  // diffusers' LoRA files key its adapters (job.save_adapter(folder, adapter_format::diffusers)); and,
  // as PEFT has no task for it, the class and module from which AutoPeftModel.from_pretrained loads
  // the base model (PEFT's auto_mapping).
  static constexpr std::string_view diffusers_component = "transformer";
  static constexpr std::string_view peft_base_model_class = "WanTransformer3DModel";
  static constexpr std::string_view peft_parent_library = "diffusers.models.transformers.transformer_wan";

  // Throws std::invalid_argument in one sentence naming the key for what from_json refuses, for a
  // config made in code.
  explicit WanImpl(const wan_config& config);
  // The velocity [B, out_channels, F, H, W] (frames, height and width rounded down to whole patches)
  // for latents [B, in_channels, F, H, W], one timestep a sample [B] (integer or floating) or one a
  // token [B, S] with S the patches F/p_t · H/p_h · W/p_w (Wan 2.2 TI2V's expand_timesteps, as
  // WanPipeline makes them), and the text encoder's states [B, L, text_dim]: diffusers' forward with
  // return_dict=False. A patch grid beyond rope_max_seq_len is refused.
  at::Tensor forward(const at::Tensor& latents, const at::Tensor& timestep, const at::Tensor& text);

  // FastVideo's Wan names the attention's output projection `to_out` (its name mapping turns
  // diffusers' `to_out.0` into it), and so do its default LoRA targets: here `to_out` is `to_out.0`,
  // so FastVideo's targets adapt the projection, and the adapters keep diffusers' names.
  static constexpr std::array<loom::target_alias, 1> lora_target_aliases{{{"to_out", "to_out.0"}}};
  // What quantized(...) leaves in full precision: diffusers' _keep_in_fp32_modules with linear layers
  // (its quantizers add them to modules_to_not_convert).
  static constexpr std::array<std::string_view, 1> unquantized_modules{"time_embedder"};

  // Its layers under tensor_parallel (loom/nn/tensor_parallel.hpp), as Megatron splits a transformer
  // block: in self- and cross-attention to_q, to_k, to_v colwise by heads and to_out.0 rowwise, the
  // q and k norms across heads colwise with them (each rank's sum of squares summed over the group),
  // the feed-forward's ffn.net.0.proj colwise and ffn.net.2 rowwise. The embeddings, the modulation,
  // the layer norms and proj_out stay whole on every rank.
  [[nodiscard]] std::vector<loom::nn::parallel_layer> tensor_parallel_plan() const;

  wan_config config;
  WanPatchEmbedding patch_embedding;
  WanConditionEmbedder condition_embedder;
  torch::nn::ModuleList blocks;
  loom::nn::Linear proj_out;
  at::Tensor scale_shift_table;  // fp32 [1, 2, dim]
  loom::nn::Sequence sequence;   // no weights: where sequence_parallel splits the tokens and joins the output
};
TORCH_MODULE(Wan);

}  // namespace loom::models
