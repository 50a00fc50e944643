#include <loom/models/causal_lm_config.hpp>

#include "config_json.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>

namespace loom::models {
namespace {

using json = nlohmann::json;

struct family_names {
  causal_lm_family family;
  std::string_view name;
  std::string_view architecture;
  std::string_view base_model;  // transformers' class without the head, also accepted
  std::string_view model_type;
};

constexpr std::array families{
    family_names{causal_lm_family::llama, "Llama", "LlamaForCausalLM", "LlamaModel", "llama"},
    family_names{causal_lm_family::mistral, "Mistral", "MistralForCausalLM", "MistralModel", "mistral"},
    family_names{causal_lm_family::qwen2, "Qwen2", "Qwen2ForCausalLM", "Qwen2Model", "qwen2"},
    family_names{causal_lm_family::qwen3, "Qwen3", "Qwen3ForCausalLM", "Qwen3Model", "qwen3"},
    family_names{causal_lm_family::gemma3, "Gemma3", "Gemma3ForCausalLM", "Gemma3TextModel", "gemma3_text"},
};

const family_names& names_of(causal_lm_family family) {
  return *std::find_if(families.begin(), families.end(), [&](const family_names& f) { return f.family == family; });
}

std::string supported_architectures() {
  std::vector<std::string_view> names;
  for (const family_names& f : families) names.push_back(f.architecture);
  return fmt::format("{}", fmt::join(names, ", "));
}

// The family config.json describes: its first architecture loom builds, else its model_type.
causal_lm_family family_of(const detail::config_json& read) {
  if (const json* architectures = read.find("architectures")) {
    if (architectures->is_array()) {
      for (const json& a : *architectures) {
        for (const family_names& f : families) {
          if (a.is_string() && (a == f.architecture || a == f.base_model)) return f.family;
        }
      }
    }
    read.fail("'architectures' is {}: loom::models::CausalLM reads {}", architectures->dump(),
              supported_architectures());
  }
  if (const json* type = read.find("model_type")) {
    for (const family_names& f : families) {
      if (*type == f.model_type) return f.family;
    }
    read.fail("'model_type' is {}: loom::models::CausalLM reads the model types of {}", type->dump(),
              supported_architectures());
  }
  if (const json* diffusers = read.find("_class_name")) {
    read.fail(
        "'_class_name' is {}: a diffusers model, not a transformers causal language model; give the folder of "
        "a checkpoint of {}",
        diffusers->dump(), supported_architectures());
  }
  read.fail("it has neither 'architectures' nor 'model_type': give the config.json that save_pretrained wrote");
}

// One rotary embedding's settings, from transformers 5's rope_parameters (or one layer type's entry of
// it) or transformers 4's rope_scaling; `where` names the object in messages.
void read_rope_scaling(const detail::config_json& read, const json& object, std::string_view where,
                       rope_parameters& rope) {
  if (!object.is_object()) read.fail("'{}' is {}: give an object", where, object.dump());
  const json* type = read.find(object, "rope_type");
  if (!type) type = read.find(object, "type");
  const std::string kind = type && type->is_string() ? type->get<std::string>() : "default";
  if (kind == "default") return;
  if (kind == "linear") {
    rope.type = rope_parameters::scaling::linear;
    rope.factor = read.number(object, "factor", 1);
    return;
  }
  if (kind == "llama3") {
    rope.type = rope_parameters::scaling::llama3;
    rope.factor = read.number(object, "factor", 8);
    rope.low_freq_factor = read.number(object, "low_freq_factor", 1);
    rope.high_freq_factor = read.number(object, "high_freq_factor", 4);
    rope.original_max_position_embeddings = read.whole(object, "original_max_position_embeddings", 8192);
    return;
  }
  read.fail("'{}' has rope_type '{}': loom computes the default rotary embedding, linear's and llama3's", where, kind);
}

// transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; earlier versions rope_theta and
// rope_scaling {rope_type or type, ...}.
void read_rope(const detail::config_json& read, causal_lm_config& config) {
  const json* parameters = read.find("rope_parameters");
  config.rope.theta = read.number(parameters ? *parameters : read.root(), "rope_theta", 10000);
  if (const json* scaling = parameters ? parameters : read.find("rope_scaling")) {
    read_rope_scaling(read, *scaling, parameters ? "rope_parameters" : "rope_scaling", config.rope);
  }
  config.sliding_rope = config.rope;
}

// Gemma 3's two: rope_parameters {full_attention: {...}, sliding_attention: {...}} (transformers 5),
// or rope_theta, rope_scaling (the global layers') and rope_local_base_freq.
void read_gemma_rope(const detail::config_json& read, causal_lm_config& config) {
  config.rope = {.theta = 1'000'000};
  config.sliding_rope = {.theta = 10'000};
  if (const json* parameters = read.find("rope_parameters")) {
    for (const auto& [key, rope] :
         {std::pair{"full_attention", &config.rope}, std::pair{"sliding_attention", &config.sliding_rope}}) {
      const json* entry = read.find(*parameters, key);
      if (!entry) continue;
      const std::string where = fmt::format("rope_parameters.{}", key);
      read_rope_scaling(read, *entry, where, *rope);
      rope->theta = read.number(*entry, "rope_theta", rope->theta);
    }
    return;
  }
  config.rope.theta = read.number("rope_theta", config.rope.theta);
  if (const json* scaling = read.find("rope_scaling")) read_rope_scaling(read, *scaling, "rope_scaling", config.rope);
  config.sliding_rope.theta = read.number("rope_local_base_freq", config.sliding_rope.theta);
}

// layer_types as config.json lists them, one per layer.
std::vector<layer_attention> read_layer_types(const detail::config_json& read, const json& types, std::int64_t layers) {
  if (!types.is_array() || static_cast<std::int64_t>(types.size()) != layers) {
    read.fail("'layer_types' is {}: give one of \"full_attention\" and \"sliding_attention\" for each of the {} layers",
              types.dump(), layers);
  }
  std::vector<layer_attention> kinds;
  for (const json& type : types) {
    if (type == "full_attention") {
      kinds.push_back(layer_attention::full);
    } else if (type == "sliding_attention") {
      kinds.push_back(layer_attention::sliding);
    } else {
      read.fail("'layer_types' has {}: loom builds \"full_attention\" and \"sliding_attention\" layers", type.dump());
    }
  }
  return kinds;
}

// Mistral: every layer in the window when sliding_window is set.
void read_mistral_window(const detail::config_json& read, causal_lm_config& config) {
  if (!read.find("sliding_window")) return;
  config.sliding_window = read.whole("sliding_window", std::nullopt);
  config.layer_types.assign(static_cast<std::size_t>(config.num_hidden_layers), layer_attention::sliding);
}

// Qwen2 and Qwen3: a window only with use_sliding_window, on the layers layer_types names (transformers
// 5), or else on those from max_window_layers on.
void read_qwen_window(const detail::config_json& read, causal_lm_config& config) {
  if (!read.flag("use_sliding_window", false) || !read.find("sliding_window")) return;
  config.sliding_window = read.whole("sliding_window", std::nullopt);
  if (const json* types = read.find("layer_types")) {
    config.layer_types = read_layer_types(read, *types, config.num_hidden_layers);
    return;
  }
  const std::int64_t first = read.whole("max_window_layers", 28);
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) {
    config.layer_types.push_back(i >= first ? layer_attention::sliding : layer_attention::full);
  }
}

// Gemma 3: its layer_types, or every sliding_window_pattern-th layer global and the others local.
void read_gemma_window(const detail::config_json& read, causal_lm_config& config) {
  if (read.flag("use_bidirectional_attention", false)) {
    read.fail("'use_bidirectional_attention' is true: loom builds Gemma 3's causal language model; set it to false");
  }
  config.sliding_window = read.whole("sliding_window", 4096);
  if (const json* types = read.find("layer_types")) {
    config.layer_types = read_layer_types(read, *types, config.num_hidden_layers);
    return;
  }
  const std::int64_t pattern = read.find("sliding_window_pattern") ? read.whole("sliding_window_pattern", 6)
                                                                   : read.whole("_sliding_window_pattern", 6);
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) {
    config.layer_types.push_back((i + 1) % pattern != 0 ? layer_attention::sliding : layer_attention::full);
  }
}

void require_activation(const detail::config_json& read, const std::string& key, std::string_view expected,
                        std::string_view why) {
  if (const json* act = read.find(key); act && *act != expected) {
    read.fail("'{}' is {}: {}, {}", key, act->dump(), why, expected);
  }
}

}  // namespace

std::string_view to_string(causal_lm_family family) noexcept { return names_of(family).name; }
std::string_view architecture_of(causal_lm_family family) noexcept { return names_of(family).architecture; }

causal_lm_config causal_lm_config::for_family(causal_lm_family family) {
  causal_lm_config config;
  config.family = family;
  switch (family) {
    case causal_lm_family::llama:
    case causal_lm_family::mistral: break;
    case causal_lm_family::qwen2: config.qkv_bias = true; break;
    case causal_lm_family::qwen3: config.qk_norm = true; break;
    case causal_lm_family::gemma3:
      config.qk_norm = true;
      config.sandwich_norms = true;
      config.norm = norm_weighting::offset_scale;
      config.activation = mlp_activation::gelu_tanh;
      config.scaled_embeddings = true;
      config.tie_word_embeddings = true;
      config.query_pre_attn_scalar = 256;
      config.rope = {.theta = 1'000'000};
      config.sliding_rope = {.theta = 10'000};
      break;
  }
  return config;
}

causal_lm_config causal_lm_config::from_pretrained(const std::filesystem::path& path) {
  const auto [file, text] =
      detail::read_config_text(path, "CausalLM", "give a checkpoint folder holding config.json, or the file");
  return from_json(text, file);
}

causal_lm_config causal_lm_config::from_json(std::string_view text, const std::string& source) {
  constexpr std::string_view what_to_give = "give the config.json of a checkpoint";
  const causal_lm_family family = family_of(detail::config_json(text, "CausalLM", source, what_to_give));
  const detail::config_json read(text, std::string(to_string(family)), source, what_to_give);
  causal_lm_config config = for_family(family);
  config.vocab_size = read.whole("vocab_size", std::nullopt);
  config.hidden_size = read.whole("hidden_size", std::nullopt);
  config.intermediate_size = read.whole("intermediate_size", std::nullopt);
  config.num_hidden_layers = read.whole("num_hidden_layers", std::nullopt);
  config.num_attention_heads = read.whole("num_attention_heads", std::nullopt);
  config.num_key_value_heads = read.whole("num_key_value_heads", config.num_attention_heads);
  // The families' own defaults where config.json has no head_dim: Qwen3's and Gemma 3's are fixed.
  const std::optional<std::int64_t> fixed_head_dim =
      family == causal_lm_family::qwen3    ? std::optional<std::int64_t>(128)
      : family == causal_lm_family::gemma3 ? std::optional<std::int64_t>(256)
                                           : std::nullopt;
  if (!read.find("head_dim") && !fixed_head_dim && config.hidden_size % config.num_attention_heads != 0) {
    read.fail("num_attention_heads = {} does not divide hidden_size = {}: give head_dim, or heads that divide it",
              config.num_attention_heads, config.hidden_size);
  }
  config.head_dim = read.whole("head_dim", fixed_head_dim.value_or(config.hidden_size / config.num_attention_heads));
  if (config.head_dim % 2 != 0) read.fail("head_dim = {} is odd: the rotary embedding rotates pairs", config.head_dim);
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    read.fail(
        "num_key_value_heads = {} does not divide num_attention_heads = {}: each key-value head serves a whole "
        "group of query heads",
        config.num_key_value_heads, config.num_attention_heads);
  }
  config.max_position_embeddings = read.whole("max_position_embeddings", config.max_position_embeddings);
  config.rms_norm_eps = read.number("rms_norm_eps", config.rms_norm_eps);
  config.tie_word_embeddings = read.flag("tie_word_embeddings", config.tie_word_embeddings);
  if (const json* pad = read.find("pad_token_id")) {
    if (!pad->is_number_integer() || pad->get<std::int64_t>() < 0 || pad->get<std::int64_t>() >= config.vocab_size) {
      read.fail("'pad_token_id' is {}: give a token id below vocab_size = {}, or null", pad->dump(), config.vocab_size);
    }
    config.pad_token_id = pad->get<std::int64_t>();
  }

  switch (family) {
    case causal_lm_family::llama:
      config.qkv_bias = config.output_bias = read.flag("attention_bias", false);
      config.mlp_bias = read.flag("mlp_bias", false);
      break;
    case causal_lm_family::mistral: read_mistral_window(read, config); break;
    case causal_lm_family::qwen2: read_qwen_window(read, config); break;
    case causal_lm_family::qwen3:
      config.qkv_bias = config.output_bias = read.flag("attention_bias", false);
      read_qwen_window(read, config);
      break;
    case causal_lm_family::gemma3:
      config.qkv_bias = config.output_bias = read.flag("attention_bias", false);
      config.query_pre_attn_scalar = read.number("query_pre_attn_scalar", 256);
      if (read.find("final_logit_softcapping"))
        config.final_logit_softcapping = read.number("final_logit_softcapping", 0);
      read_gemma_window(read, config);
      break;
  }
  if (family == causal_lm_family::gemma3) {
    read_gemma_rope(read, config);
    require_activation(read, "hidden_activation", "gelu_pytorch_tanh", "Gemma 3's MLP is gated by GELU's tanh form");
  } else {
    read_rope(read, config);
    require_activation(read, "hidden_act", "silu", fmt::format("{}'s MLP is SwiGLU", to_string(family)));
  }
  return config;
}

layer_attention causal_lm_config::attention_of(std::int64_t layer) const {
  return layer_types.empty() ? layer_attention::full : layer_types.at(static_cast<std::size_t>(layer));
}

}  // namespace loom::models
