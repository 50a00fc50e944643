#include <loom/models/wan.hpp>

#include "config_json.hpp"

#include <loom/base/text.hpp>
#include <loom/nn/deferred_init.hpp>
#include <loom/precision/attention.hpp>
#include <loom/precision/precision.hpp>

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/init.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace loom::models {
namespace {

using json = nlohmann::json;

constexpr std::string_view class_name = "WanTransformer3DModel";
constexpr std::string_view supported_qk_norm = "rms_norm_across_heads";
// WanRotaryPosEmbed's theta, which diffusers does not take from the config.
constexpr double rope_theta = 10000;
// get_timestep_embedding's max_period.
constexpr double timestep_max_period = 10000;

// Three positive whole numbers: a patch's frames, height and width.
std::array<std::int64_t, 3> read_triple(const detail::config_json& read, const std::string& key,
                                        std::array<std::int64_t, 3> fallback) {
  const json* value = read.find(key);
  if (!value) return fallback;
  if (!value->is_array() || value->size() != 3) {
    read.fail("'{}' is {}: give three positive whole numbers, frames, height and width", key, value->dump());
  }
  return {read.positive((*value)[0], key), read.positive((*value)[1], key), read.positive((*value)[2], key)};
}

// What loom's Wan cannot build, in the words of one sentence after the config's name; none if it can.
std::optional<std::string> unsupported(const wan_config& config) {
  if (config.image_dim) {
    return fmt::format(
        "'image_dim' is {}: image conditioning (Wan 2.1 I2V and FLF2V) is not supported; loom::models::Wan is the "
        "text-to-video transformer, whose image_dim is null",
        *config.image_dim);
  }
  if (config.added_kv_proj_dim) {
    return fmt::format(
        "'added_kv_proj_dim' is {}: the image keys and values of image conditioning (Wan 2.1 I2V and FLF2V) are not "
        "supported; loom::models::Wan is the text-to-video transformer, whose added_kv_proj_dim is null",
        *config.added_kv_proj_dim);
  }
  if (config.qk_norm != supported_qk_norm) {
    return fmt::format(
        "'qk_norm' is \"{}\": loom's Wan normalises queries and keys with one RMSNorm across heads, as diffusers' "
        "WanAttention does; give \"{}\"",
        config.qk_norm, supported_qk_norm);
  }
  if (config.attention_head_dim % 2 != 0) {
    return fmt::format("'attention_head_dim' is {}, odd: the rotary embedding turns pairs of a head's channels",
                       config.attention_head_dim);
  }
  return std::nullopt;
}

const wan_config& checked(const wan_config& config) {
  if (const auto problem = unsupported(config)) throw_error<std::invalid_argument>("loom::models::Wan: {}", *problem);
  return config;
}

// The angles position · θ^(-2i/dim) of positions [0, count) for a rotary embedding of `dim` channels,
// [count, dim / 2]: in float64 and then narrowed to fp32, as get_1d_rotary_pos_embed computes them
// (freqs_dtype float64) for WanRotaryPosEmbed's buffers.
std::pair<at::Tensor, at::Tensor> axis_cos_sin(std::int64_t dim, std::int64_t count, c10::Device device) {
  const auto wide = at::TensorOptions(at::kDouble).device(device);
  const at::Tensor inverse_frequencies =
      1.0 / at::pow(rope_theta, at::arange(0, dim, 2, wide) / static_cast<double>(dim));
  const at::Tensor angles = at::outer(at::arange(count, wide.dtype(at::kLong)), inverse_frequencies);
  return {angles.cos().to(at::kFloat), angles.sin().to(at::kFloat)};
}

// Each patch's rotary cos and sin [frames·height·width, head_dim / 2]: the head's channels split
// into the frame's, the row's and the column's (the row and column 2·(head_dim / 6) each, the frame
// the rest), each turned by its own position in the grid.
std::pair<at::Tensor, at::Tensor> grid_cos_sin(std::int64_t head_dim, std::int64_t frames, std::int64_t height,
                                               std::int64_t width, c10::Device device) {
  const std::int64_t spatial_dim = 2 * (head_dim / 6);
  const std::int64_t frame_dim = head_dim - 2 * spatial_dim;
  const auto [frame_cos, frame_sin] = axis_cos_sin(frame_dim, frames, device);
  const auto [row_cos, row_sin] = axis_cos_sin(spatial_dim, height, device);
  const auto [column_cos, column_sin] = axis_cos_sin(spatial_dim, width, device);
  const auto over_grid = [&](const at::Tensor& frame, const at::Tensor& row, const at::Tensor& column) {
    return at::cat({frame.view({frames, 1, 1, -1}).expand({frames, height, width, -1}),
                    row.view({1, height, 1, -1}).expand({frames, height, width, -1}),
                    column.view({1, 1, width, -1}).expand({frames, height, width, -1})},
                   -1)
        .reshape({frames * height * width, head_dim / 2});
  };
  return {over_grid(frame_cos, row_cos, column_cos), over_grid(frame_sin, row_sin, column_sin)};
}

// x [B, S, heads, head_dim] with each pair of channels (2i, 2i + 1) turned by the angle whose cos and
// sin [S, head_dim / 2] are given: computed in fp32 (diffusers' fp32 tables promote a bf16 x) and
// returned in x's dtype.
at::Tensor rotated(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor pairs = x.unflatten(-1, {-1, 2});
  const at::Tensor even = pairs.select(-1, 0);
  const at::Tensor odd = pairs.select(-1, 1);
  const at::Tensor c = cos.unsqueeze(1);
  const at::Tensor s = sin.unsqueeze(1);
  return at::stack({even * c - odd * s, even * s + odd * c}, -1).flatten(-2).to(x.scalar_type());
}

// diffusers' FP32LayerNorm without affine parameters: normalised in fp32, returned in fp32 (the
// callers modulate in fp32 and cast back themselves).
at::Tensor fp32_layer_norm(const at::Tensor& x, double eps) {
  return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, /*weight=*/{}, /*bias=*/{}, eps);
}

// Registers a shift-and-scale table [1, rows, dim] in fp32 (diffusers keeps it there), drawn as
// torch.randn(1, rows, dim) / dim ** 0.5.
at::Tensor scale_shift_table_of(torch::nn::Module& module, std::int64_t rows, std::int64_t dim) {
  at::Tensor table = module.register_parameter("scale_shift_table", loom::nn::empty({1, rows, dim}, at::kFloat));
  loom::nn::initialise(table, {[dim](at::Tensor& t) { t.normal_().div_(std::sqrt(static_cast<double>(dim))); }});
  return table;
}

// diffusers keeps the time embedder in fp32 (_keep_in_fp32_modules), whatever default_dtype(...) says.
WanTimeEmbedder fp32_time_embedder(const wan_config& config) {
  const default_dtype_scope fp32(loom::fp32);
  return WanTimeEmbedder(config.freq_dim, config.inner_dim());
}

loom::nn::Linear linear(std::int64_t in, std::int64_t out) {
  return loom::nn::Linear(torch::nn::LinearOptions(in, out).bias(true));
}

}  // namespace

wan_config wan_config::from_pretrained(const std::filesystem::path& path) {
  const auto [file, text] = detail::read_config_text(
      path, "Wan", "give the transformer's folder holding config.json (a pipeline's transformer/), or the file");
  return from_json(text, file);
}

wan_config wan_config::from_json(std::string_view text, const std::string& source) {
  const detail::config_json read(text, "Wan", source, "give the config.json of a WanTransformer3DModel checkpoint");
  if (const json* name = read.find("_class_name"); name && *name != class_name) {
    read.fail("'_class_name' is {}: loom::models::Wan reads {} checkpoints", name->dump(), class_name);
  }
  // A transformers config (a language model's) has no _class_name, and Wan's defaults would take it
  // silently: said here, not later as clips that do not fit.
  if (const json* architectures = read.find("architectures"); architectures && !read.find("_class_name")) {
    read.fail(
        "'architectures' is {}: a transformers model, not a diffusers {} (whose config.json names it in "
        "'_class_name'); give a Wan transformer's folder (a pipeline's transformer/)",
        architectures->dump(), class_name);
  }
  wan_config config;
  config.patch_size = read_triple(read, "patch_size", config.patch_size);
  config.num_attention_heads = read.whole("num_attention_heads", config.num_attention_heads);
  config.attention_head_dim = read.whole("attention_head_dim", config.attention_head_dim);
  config.in_channels = read.whole("in_channels", config.in_channels);
  // diffusers takes `out_channels or in_channels`: a null one is in_channels, a missing one its default.
  const auto out_channels = read.root().find("out_channels");
  config.out_channels = out_channels == read.root().end() ? config.out_channels
                        : out_channels->is_null()         ? config.in_channels
                                                          : read.positive(*out_channels, "out_channels");
  config.text_dim = read.whole("text_dim", config.text_dim);
  config.freq_dim = read.whole("freq_dim", config.freq_dim);
  config.ffn_dim = read.whole("ffn_dim", config.ffn_dim);
  config.num_layers = read.whole("num_layers", config.num_layers);
  config.cross_attn_norm = read.flag("cross_attn_norm", config.cross_attn_norm);
  if (const auto qk_norm = read.root().find("qk_norm"); qk_norm != read.root().end()) {
    if (!qk_norm->is_string()) read.fail("'qk_norm' is {}: give \"{}\"", qk_norm->dump(), supported_qk_norm);
    config.qk_norm = qk_norm->get<std::string>();
  }
  config.eps = read.number("eps", config.eps);
  config.image_dim = read.optional_whole("image_dim");
  config.added_kv_proj_dim = read.optional_whole("added_kv_proj_dim");
  config.rope_max_seq_len = read.whole("rope_max_seq_len", config.rope_max_seq_len);
  config.pos_embed_seq_len = read.optional_whole("pos_embed_seq_len");
  if (const auto problem = unsupported(config)) read.fail("{}", *problem);
  return config;
}

WanPatchEmbeddingImpl::WanPatchEmbeddingImpl(std::int64_t in_channels, std::int64_t out_channels,
                                             std::array<std::int64_t, 3> patch_size)
    : weight(register_parameter(
          "weight", loom::nn::empty({out_channels, in_channels, patch_size[0], patch_size[1], patch_size[2]}))),
      bias(register_parameter("bias", loom::nn::empty({out_channels}))),
      patch_size_(patch_size) {
  // torch::nn::Conv3d's draws: kaiming_uniform_(a = √5) over fan_in = in_channels · the patch's size.
  loom::nn::initialise(weight, {[](at::Tensor& w) { torch::nn::init::kaiming_uniform_(w, std::sqrt(5)); }});
  const double bound = 1 / std::sqrt(static_cast<double>(in_channels * patch_size[0] * patch_size[1] * patch_size[2]));
  loom::nn::initialise(bias, {[bound](at::Tensor& b) { torch::nn::init::uniform_(b, -bound, bound); }});
}

at::Tensor WanPatchEmbeddingImpl::forward(const at::Tensor& latents) {
  return at::conv3d(latents, weight, bias, patch_size_);
}

WanRMSNormImpl::WanRMSNormImpl(std::int64_t size, double eps)
    : weight(register_parameter("weight", loom::nn::empty({size}))), eps_(eps) {
  loom::nn::initialise(weight, {[](at::Tensor& w) { w.fill_(1); }, /*draws=*/false});
}

at::Tensor WanRMSNormImpl::forward(const at::Tensor& x) {
  if (!split_) return at::rms_norm(x, {x.size(-1)}, weight, eps_);
  // at::rms_norm's arithmetic (in x's opmath type, the weight too, cast back once at the end: equal to
  // it bit for bit in one rank), with the mean square over every rank's features.
  const at::Tensor wide = x.to(at::toOpMathType(x.scalar_type()));
  const std::int64_t features = x.size(-1) * split_->size();
  const at::Tensor mean_square = split_->sum(wide.pow(2).sum(-1, /*keepdim=*/true)) / features;
  return (wide * at::rsqrt(mean_square + eps_) * weight.to(wide.scalar_type())).to(x.scalar_type());
}

std::optional<loom::nn::parallel_module::cut> WanRMSNormImpl::cut_by(loom::nn::parallel_style style) const {
  if (style == loom::nn::parallel_style::colwise) return cut{weight.size(0), "features"};
  return std::nullopt;
}

std::vector<loom::nn::split_parameter> WanRMSNormImpl::split(loom::nn::parallel_style style,
                                                             std::shared_ptr<loom::nn::tensor_split> split) {
  if (split_) throw std::logic_error("loom::models::WanRMSNorm is split already");
  if (!cut_by(style)) throw std::logic_error("loom::models::WanRMSNorm splits colwise");
  torch::NoGradGuard no_grad;
  at::Tensor(weight).set_data(split->slice(weight, 0));
  split_ = std::move(split);
  return {{"weight", 0}};
}

WanFP32LayerNormImpl::WanFP32LayerNormImpl(std::int64_t size, double eps)
    : weight(register_parameter("weight", loom::nn::empty({size}, at::kFloat))),
      bias(register_parameter("bias", loom::nn::empty({size}, at::kFloat))),
      eps_(eps) {
  loom::nn::initialise(weight, {[](at::Tensor& w) { w.fill_(1); }, /*draws=*/false});
  loom::nn::initialise(bias, {[](at::Tensor& b) { b.fill_(0); }, /*draws=*/false});
}

at::Tensor WanFP32LayerNormImpl::forward(const at::Tensor& x) {
  return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, weight.to(at::kFloat), bias.to(at::kFloat), eps_)
      .to(x.scalar_type());
}

WanAttentionImpl::WanAttentionImpl(std::int64_t dim, std::int64_t heads, double eps, kind attends)
    : to_q(register_module("to_q", linear(dim, dim))),
      to_k(register_module("to_k", linear(dim, dim))),
      to_v(register_module("to_v", linear(dim, dim))),
      to_out(register_module("to_out", torch::nn::ModuleList())),
      out_proj(linear(dim, dim)),
      norm_q(register_module("norm_q", WanRMSNorm(dim, eps))),
      norm_k(register_module("norm_k", WanRMSNorm(dim, eps))),
      head_dim_(dim / heads) {
  to_out->push_back(out_proj);
  if (attends == kind::self) {
    attention = register_module("attention", loom::nn::Attention(loom::nn::attention_options{
                                                 .heads = heads, .head_dim = dim / heads, .scale = std::nullopt}));
  }
}

at::Tensor WanAttentionImpl::forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& cos,
                                     const at::Tensor& sin) {
  // As many heads as the projections give: under tensor_parallel this rank's slice of them.
  at::Tensor q = norm_q(to_q(x)).unflatten(2, {-1, head_dim_});
  at::Tensor k = norm_k(to_k(context)).unflatten(2, {-1, head_dim_});
  const at::Tensor v = to_v(context).unflatten(2, {-1, head_dim_});
  if (cos.defined()) {
    q = rotated(q, cos, sin);
    k = rotated(k, cos, sin);
  }
  const at::Tensor attended =
      attention
          ? attention(q, k, v)
          : loom::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2);
  return out_proj(attended.flatten(2, 3).to(q.scalar_type()));
}

WanGELUImpl::WanGELUImpl(std::int64_t dim, std::int64_t ffn_dim)
    : proj(register_module("proj", linear(dim, ffn_dim))) {}

at::Tensor WanGELUImpl::forward(const at::Tensor& x) { return at::gelu(proj(x), "tanh"); }

WanFeedForwardImpl::WanFeedForwardImpl(std::int64_t dim, std::int64_t ffn_dim)
    : net(register_module("net", std::make_shared<torch::nn::Module>("FeedForward.net"))),
      project_in(net->register_module("0", WanGELU(dim, ffn_dim))),
      project_out(net->register_module("2", linear(ffn_dim, dim))) {}

at::Tensor WanFeedForwardImpl::forward(const at::Tensor& x) { return project_out(project_in(x)); }

WanTransformerBlockImpl::WanTransformerBlockImpl(const wan_config& config)
    : attn1(register_module("attn1", WanAttention(config.inner_dim(), config.num_attention_heads, config.eps,
                                                  WanAttentionImpl::kind::self))),
      attn2(register_module("attn2", WanAttention(config.inner_dim(), config.num_attention_heads, config.eps,
                                                  WanAttentionImpl::kind::cross))),
      norm2(config.cross_attn_norm ? register_module("norm2", WanFP32LayerNorm(config.inner_dim(), config.eps))
                                   : WanFP32LayerNorm(nullptr)),
      ffn(register_module("ffn", WanFeedForward(config.inner_dim(), config.ffn_dim))),
      scale_shift_table(scale_shift_table_of(*this, 6, config.inner_dim())),
      eps_(config.eps) {}

at::Tensor WanTransformerBlockImpl::forward(const at::Tensor& x, const at::Tensor& text,
                                            const at::Tensor& timestep_proj, const at::Tensor& cos,
                                            const at::Tensor& sin) {
  // The modulations, the norms and the gated sums in fp32, each result cast back to x's dtype. A
  // token's own modulations ([B, S, 6, dim]) lose their chunked axis to line up with x's tokens.
  std::vector<at::Tensor> modulation = (scale_shift_table + timestep_proj.to(at::kFloat)).chunk(6, -2);
  if (timestep_proj.dim() == 4) {
    for (at::Tensor& each : modulation) each = each.squeeze(-2);
  }
  const at::Tensor &shift = modulation[0], &scale = modulation[1], &gate = modulation[2];
  const at::Tensor &ffn_shift = modulation[3], &ffn_scale = modulation[4], &ffn_gate = modulation[5];
  const at::ScalarType type = x.scalar_type();

  const at::Tensor attention_input = (fp32_layer_norm(x, eps_) * (1 + scale) + shift).to(type);
  at::Tensor h = (x.to(at::kFloat) + attn1(attention_input, attention_input, cos, sin) * gate).to(type);

  const at::Tensor cross_input = norm2 ? norm2(h) : h;
  h = h + attn2(cross_input, text);

  const at::Tensor ffn_input = (fp32_layer_norm(h, eps_) * (1 + ffn_scale) + ffn_shift).to(type);
  return (h.to(at::kFloat) + ffn(ffn_input).to(at::kFloat) * ffn_gate).to(type);
}

WanTimeEmbedderImpl::WanTimeEmbedderImpl(std::int64_t freq_dim, std::int64_t dim)
    : linear_1(register_module("linear_1", linear(freq_dim, dim))),
      linear_2(register_module("linear_2", linear(dim, dim))) {}

at::Tensor WanTimeEmbedderImpl::forward(const at::Tensor& x) { return linear_2(at::silu(linear_1(x))); }

WanTextEmbedderImpl::WanTextEmbedderImpl(std::int64_t text_dim, std::int64_t dim)
    : linear_1(register_module("linear_1", linear(text_dim, dim))),
      linear_2(register_module("linear_2", linear(dim, dim))) {}

at::Tensor WanTextEmbedderImpl::forward(const at::Tensor& text) { return linear_2(at::gelu(linear_1(text), "tanh")); }

WanConditionEmbedderImpl::WanConditionEmbedderImpl(const wan_config& config)
    : time_embedder(register_module("time_embedder", fp32_time_embedder(config))),
      time_proj(register_module("time_proj", linear(config.inner_dim(), 6 * config.inner_dim()))),
      text_embedder(register_module("text_embedder", WanTextEmbedder(config.text_dim, config.inner_dim()))),
      freq_dim_(config.freq_dim) {}

WanConditionEmbedderImpl::embedded WanConditionEmbedderImpl::forward(const at::Tensor& timestep,
                                                                     const at::Tensor& text) {
  // Timesteps(freq_dim, flip_sin_to_cos=True, downscale_freq_shift=0), in fp32, of each timestep; per
  // token, of the flattened [B · S] as diffusers computes them, then [B, S, freq_dim].
  const at::Tensor flat = timestep.flatten();
  const std::int64_t half = freq_dim_ / 2;
  const at::Tensor exponent =
      at::arange(0, half, timestep.options().dtype(at::kFloat)) * -std::log(timestep_max_period) / half;
  const at::Tensor angles = flat.unsqueeze(1).to(at::kFloat) * exponent.exp().unsqueeze(0);
  at::Tensor sinusoids = at::cat({angles.cos(), angles.sin()}, -1);
  if (freq_dim_ % 2 != 0) sinusoids = at::pad(sinusoids, {0, 1});
  if (timestep.dim() == 2) sinusoids = sinusoids.unflatten(0, {timestep.size(0), timestep.size(1)});

  const at::Tensor temb =
      time_embedder(sinusoids.to(time_embedder->linear_1->weight.scalar_type())).to(text.scalar_type());
  return {temb, time_proj(at::silu(temb)).unflatten(-1, {6, -1}), text_embedder(text)};
}

std::vector<loom::nn::parallel_layer> WanImpl::tensor_parallel_plan() const {
  using loom::nn::parallel_style;
  std::vector<loom::nn::parallel_layer> plan;
  for (const std::string_view attention : {"attn1", "attn2"}) {
    const auto layer = [attention](std::string_view name, parallel_style style) {
      return loom::nn::parallel_layer{fmt::format("blocks.*.{}.{}", attention, name), style};
    };
    plan.push_back(layer("to_q", parallel_style::colwise));
    plan.push_back(layer("to_k", parallel_style::colwise));
    plan.push_back(layer("to_v", parallel_style::colwise));
    plan.push_back(layer("norm_q", parallel_style::colwise));
    plan.push_back(layer("norm_k", parallel_style::colwise));
    plan.push_back(layer("to_out.0", parallel_style::rowwise));
  }
  plan.push_back({"blocks.*.ffn.net.0.proj", parallel_style::colwise});
  plan.push_back({"blocks.*.ffn.net.2", parallel_style::rowwise});
  return plan;
}

WanImpl::WanImpl(const wan_config& config_)
    : config(checked(config_)),
      patch_embedding(register_module("patch_embedding",
                                      WanPatchEmbedding(config.in_channels, config.inner_dim(), config.patch_size))),
      condition_embedder(register_module("condition_embedder", WanConditionEmbedder(config))),
      blocks(register_module("blocks", torch::nn::ModuleList())),
      proj_out(
          register_module("proj_out", linear(config.inner_dim(), config.out_channels * config.patch_size[0] *
                                                                     config.patch_size[1] * config.patch_size[2]))),
      scale_shift_table(scale_shift_table_of(*this, 2, config.inner_dim())),
      sequence(register_module("sequence", loom::nn::Sequence())) {
  for (std::int64_t i = 0; i < config.num_layers; ++i) blocks->push_back(std::make_shared<WanTransformerBlock>(config));
}

at::Tensor WanImpl::forward(const at::Tensor& latents, const at::Tensor& timestep, const at::Tensor& text) {
  if (latents.dim() != 5) {
    throw_error<std::invalid_argument>(
        "loom::models::Wan: the latents are {}-dimensional: give them as [batch, channels, frames, height, width]",
        latents.dim());
  }
  if (timestep.dim() != 1 && timestep.dim() != 2) {
    throw_error<std::invalid_argument>(
        "loom::models::Wan: the timestep is {}-dimensional: give one a sample, [batch], or one a token, [batch, "
        "patches] (Wan 2.2 TI2V's expand_timesteps)",
        timestep.dim());
  }
  if (text.dim() != 3) {
    throw_error<std::invalid_argument>(
        "loom::models::Wan: the text states are {}-dimensional: give them as [batch, length, text_dim]", text.dim());
  }
  const std::int64_t batch = latents.size(0);
  const auto [patch_frames, patch_height, patch_width] = config.patch_size;
  const std::int64_t frames = latents.size(2) / patch_frames;
  const std::int64_t height = latents.size(3) / patch_height;
  const std::int64_t width = latents.size(4) / patch_width;
  if (std::max({frames, height, width}) > config.rope_max_seq_len) {
    throw_error<std::invalid_argument>(
        "loom::models::Wan: the latents make {}x{}x{} patches (frames, height, width), more along one axis than "
        "rope_max_seq_len = {} rotary positions: give smaller latents or a config with a larger rope_max_seq_len",
        frames, height, width, config.rope_max_seq_len);
  }
  const bool per_token = timestep.dim() == 2;
  if (per_token && (timestep.size(0) != batch || timestep.size(1) != frames * height * width)) {
    throw_error<std::invalid_argument>(
        "loom::models::Wan: the timesteps are [{}], one a token, but the latents make {} × {} patches ({}x{}x{}): "
        "give [{}, {}], as WanPipeline's expand_timesteps makes them",
        fmt::join(timestep.sizes(), ", "), batch, frames * height * width, frames, height, width, batch,
        frames * height * width);
  }
  at::Tensor x = sequence->split(patch_embedding(latents).flatten(2).transpose(1, 2), 1).contiguous();
  const auto [grid_cos, grid_sin] = grid_cos_sin(config.attention_head_dim, frames, height, width, latents.device());
  const at::Tensor cos = sequence->local(grid_cos, 0), sin = sequence->local(grid_sin, 0);

  WanConditionEmbedderImpl::embedded condition = condition_embedder(timestep, text);
  if (per_token) {
    // A token's modulations go with it: this rank's tokens' under sequence parallelism.
    condition.temb = sequence->local(condition.temb, 1);
    condition.timestep_proj = sequence->local(condition.timestep_proj, 1);
  }
  for (const auto& block : *blocks) {
    x = block->as<WanTransformerBlock>()->forward(x, condition.text, condition.timestep_proj, cos, sin);
  }

  std::vector<at::Tensor> shift_scale = (scale_shift_table + condition.temb.unsqueeze(-2)).chunk(2, -2);
  if (per_token) {
    for (at::Tensor& each : shift_scale) each = each.squeeze(-2);
  }
  x = (fp32_layer_norm(x, config.eps) * (1 + shift_scale[1]) + shift_scale[0]).to(x.scalar_type());
  // Each patch's p_t·p_h·p_w·out_channels values back into the video, channel last within a patch.
  return sequence->whole(proj_out(x), 1)
      .reshape({batch, frames, height, width, patch_frames, patch_height, patch_width, -1})
      .permute({0, 7, 1, 4, 2, 5, 3, 6})
      .flatten(6, 7)
      .flatten(4, 5)
      .flatten(2, 3);
}

}  // namespace loom::models
