#include "gradaccum/data/gguf_tokenizer.h"

#include <algorithm>
#include <map>
#include <unordered_set>

#include "gradaccum/base/check.h"
#include "gradaccum/base/files.h"
#include "gradaccum/data/byte_level_bpe.h"
#include "gradaccum/data/utf8.h"

namespace gradaccum::data {
namespace {

using nlohmann::json;

// llama.cpp's token types (llama_token_type).
constexpr int64_t kControlToken = 3;
constexpr int64_t kUserDefinedToken = 4;

// The expressions transformers' GGUF conversion splits with before a ByteLevel without its own
// (Llama 3's and Qwen2's tokenizers; Oniguruma syntax, as in their tokenizer.json files).
constexpr const char* kLlama3Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

struct PreTokenizerName {
  const char* name;
  const char* split;  // null: GPT-2's ByteLevel with its own expression
};
// tokenizer.ggml.pre values and how transformers converts each.
constexpr PreTokenizerName kPreTokenizers[] = {
    {"gpt-2", nullptr},          {"smollm", nullptr},
    {"llama-bpe", kLlama3Split}, {"llama3", kLlama3Split},
    {"llama-v3", kLlama3Split},  {"smaug-bpe", kLlama3Split},
    {"dbrx", kLlama3Split},      {"falcon3", kLlama3Split},
    {"qwen2", kQwen2Split},      {"deepseek-r1-qwen", kQwen2Split},
    {"megrez", kQwen2Split},
};

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json pre_tokenizer_of(const formats::GgufFile& file) {
  const char* key = "tokenizer.ggml.pre";
  if (!file.has(key)) return byte_level(true);
  const std::string& name = file.string(key);
  for (const auto& known : kPreTokenizers) {
    if (name != known.name) continue;
    if (known.split == nullptr) return byte_level(true);
    return {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"}, {"pattern", {{"Regex", known.split}}}, {"behavior", "Isolated"}, {"invert", false}},
              byte_level(false)}}};
  }
  std::string names;
  for (const auto& known : kPreTokenizers) names += (names.empty() ? "" : ", ") + std::string(known.name);
  throw Error(fmt::format("{}: {} is {}, a pre-tokenizer gradaccum does not know (known: {})", file.path(), key,
                          json(name).dump(-1, ' ', false, json::error_handler_t::replace), names));
}

// The token as tokenizer.json spells it: unchanged when every character is one of GPT-2's byte
// characters, else the byte characters of its UTF-8 bytes.
std::string byte_level_spelling(const std::string& token, const std::unordered_set<char32_t>& alphabet) {
  const auto code_points = decode_utf8(token);
  if (std::all_of(code_points.begin(), code_points.end(), [&](char32_t c) { return alphabet.count(c) > 0; })) {
    return token;
  }
  std::string spelled;
  for (const unsigned char b : token) append_utf8(spelled, byte_to_unicode()[b]);
  return spelled;
}

}  // namespace

json gguf_tokenizer_json(const formats::GgufFile& file) {
  const auto& path = file.path();
  const std::string& model = file.string("tokenizer.ggml.model");
  GA_CHECK(model == "gpt2", "{}: tokenizer.ggml.model is \"{}\"; only \"gpt2\" (byte-level BPE) is supported", path,
           model);
  json pre_tokenizer = pre_tokenizer_of(file);
  const auto& tokens = file.string_array("tokenizer.ggml.tokens");
  GA_CHECK(!tokens.empty(), "{}: tokenizer.ggml.tokens is empty", path);
  std::vector<int64_t> types;
  if (file.has("tokenizer.ggml.token_type")) {
    types = file.i64_array("tokenizer.ggml.token_type");
    GA_CHECK(types.size() == tokens.size(), "{}: tokenizer.ggml.token_type has {} entries for {} tokens", path,
             types.size(), tokens.size());
  }
  const std::unordered_set<char32_t> alphabet(byte_to_unicode().begin(), byte_to_unicode().end());

  json vocab = json::object();
  std::vector<bool> byte_spelled(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    const auto& token = tokens[id];
    GA_CHECK(is_valid_utf8(token) && !token.empty(), "{}: tokenizer.ggml.tokens[{}] is {}", path, id,
             token.empty() ? "empty" : "not valid UTF-8");
    const auto spelled = byte_level_spelling(token, alphabet);
    byte_spelled[id] = spelled == token;
    vocab[spelled] = static_cast<int64_t>(id);  // a later token of the same spelling wins, as in transformers
  }

  // Added tokens by id: control and user-defined tokens, then the special ids' tokens.
  std::map<int64_t, json> added;
  auto add = [&](size_t id, bool special) {
    added.emplace(static_cast<int64_t>(id), json{{"id", static_cast<int64_t>(id)},
                                                 {"content", tokens[id]},
                                                 {"single_word", false},
                                                 {"lstrip", false},
                                                 {"rstrip", false},
                                                 {"normalized", false},
                                                 {"special", special}});
  };
  for (size_t id = 0; id < types.size(); ++id) {
    if (byte_spelled[id] && (types[id] == kControlToken || types[id] == kUserDefinedToken)) {
      add(id, types[id] == kControlToken);
    }
  }
  for (const char* name : {"bos", "eos", "unknown", "padding"}) {
    const std::string key = fmt::format("tokenizer.ggml.{}_token_id", name);
    if (!file.has(key)) continue;
    const uint64_t id = file.u64(key);
    GA_CHECK(id < tokens.size(), "{}: {} is {}, beyond the {} tokens", path, key, id, tokens.size());
    GA_CHECK(byte_spelled[id], "{}: {} is {}, a token that is not written in byte characters", path, key, id);
    const auto found = added.find(static_cast<int64_t>(id));
    if (found == added.end()) {
      add(id, true);
    } else {
      found->second["special"] = true;
    }
  }
  json added_tokens = json::array();
  for (auto& [id, token] : added) added_tokens.push_back(std::move(token));

  json merges = json::array();
  const auto& merge_strings = file.string_array("tokenizer.ggml.merges");
  for (size_t i = 0; i < merge_strings.size(); ++i) {
    const auto& m = merge_strings[i];
    const auto space = m.find(' ');
    GA_CHECK(
        space != std::string::npos && space > 0 && space + 1 < m.size() && m.find(' ', space + 1) == std::string::npos,
        "{}: tokenizer.ggml.merges[{}] is not two tokens separated by one space", path, i);
    merges.push_back({m.substr(0, space), m.substr(space + 1)});
  }

  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", std::move(added_tokens)},
      {"normalizer", nullptr},
      {"pre_tokenizer", std::move(pre_tokenizer)},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", json::object()}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", std::move(vocab)},
        {"merges", std::move(merges)}}},
  };
}

void write_tokenizer_json(const std::string& path, const json& tokenizer) {
  base::write_file_atomically(path, tokenizer.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
}

}  // namespace gradaccum::data
