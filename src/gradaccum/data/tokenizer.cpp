#include "gradaccum/data/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gradaccum/base/check.h"
#include "gradaccum/data/bloom_pretokenizer.h"
#include "gradaccum/data/gpt2_pretokenizer.h"
#include "gradaccum/data/tiktoken_merges.h"
#include "gradaccum/data/tiktoken_ranks.h"
#include "gradaccum/data/utf8.h"

namespace gradaccum::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Error messages are one line; parser messages may quote file content.
std::string flatten_newlines(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::replace(text.begin(), text.end(), '\r', ' ');
  return text;
}

std::string read_tokenizer_file(const std::string& path) {
  std::error_code ec;
  GA_CHECK(!fs::is_directory(path, ec), "tokenizer file {} is a directory", path);
  std::ifstream in(path, std::ios::binary);
  GA_CHECK(in, "cannot open tokenizer file {}: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  GA_CHECK(!in.bad(), "cannot read tokenizer file {}", path);
  return text.str();
}

json parse_json(const std::string& path) {
  try {
    return json::parse(read_tokenizer_file(path));
  } catch (const json::exception& e) {
    throw Error(flatten_newlines(fmt::format("tokenizer file {} is not valid JSON: {}", path, e.what())));
  }
}

// id values of a {"token": id, ...} object.
std::unordered_map<std::string, TokenId> read_vocab(const json& object, const std::string& path, const char* where) {
  GA_CHECK(object.is_object(), "tokenizer file {}: {} is not a JSON object of token ids", path, where);
  std::unordered_map<std::string, TokenId> vocab;
  vocab.reserve(object.size());
  for (const auto& [token, id] : object.items()) {
    GA_CHECK(id.is_number_integer(), "tokenizer file {}: {}: the id of token {} is not an integer", path, where,
             flatten_newlines(json(token).dump()));
    vocab.emplace(token, id.get<TokenId>());
  }
  return vocab;
}

std::vector<ByteLevelBpe::Merge> read_vocab_bpe(const std::string& path) {
  const std::string text = read_tokenizer_file(path);
  std::vector<ByteLevelBpe::Merge> merges;
  std::size_t line_no = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const std::size_t space = line.find(' ');
    const bool two_parts = space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                           line.find(' ', space + 1) == std::string_view::npos;
    GA_CHECK(two_parts, "tokenizer file {} line {}: expected two tokens separated by one space, got {}", path, line_no,
             flatten_newlines(json(std::string(line)).dump()));
    merges.emplace_back(std::string(line.substr(0, space)), std::string(line.substr(space + 1)));
  }
  GA_CHECK(!merges.empty(), "tokenizer file {} has no merges", path);
  return merges;
}

std::vector<ByteLevelBpe::Merge> read_hf_merges(const json& array, const std::string& path) {
  GA_CHECK(array.is_array(), "tokenizer file {}: model.merges is not an array", path);
  std::vector<ByteLevelBpe::Merge> merges;
  merges.reserve(array.size());
  for (std::size_t i = 0; i < array.size(); ++i) {
    const json& m = array[i];
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const std::size_t space = s.find(' ');
      GA_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
               "tokenizer file {}: model.merges[{}] is not two tokens separated by one space: {}", path, i,
               flatten_newlines(m.dump()));
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else {
      GA_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
               "tokenizer file {}: model.merges[{}] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
  return merges;
}

bool is_null_or_empty(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

std::string type_of(const json& step) {
  return step.is_object() && step.contains("type") && step["type"].is_string() ? step["type"].get<std::string>()
                                                                               : std::string("?");
}

struct PreTokenizerConfig {
  TextSplit split = TextSplit::kGpt2Regex;
  bool add_prefix_space = false;
};

std::string describe_step(const json& step) {
  std::string text = type_of(step);
  if (step.is_object() && step.contains("pattern")) text += " with pattern " + flatten_newlines(step["pattern"].dump());
  return text;
}

// Accepts [ByteLevel] (GPT-2's kind) and [Split(BLOOM's regex), ByteLevel
// without regex] (BLOOM's), alone or in a Sequence.
PreTokenizerConfig read_pre_tokenizer(const json& root, const std::string& path) {
  GA_CHECK(!is_null_or_empty(root, "pre_tokenizer"),
           "tokenizer file {}: no pre_tokenizer (only byte-level BPE is supported)", path);
  const json& pre = root["pre_tokenizer"];
  std::vector<json> steps{pre};
  if (type_of(pre) == "Sequence") {
    GA_CHECK(pre.contains("pretokenizers") && pre["pretokenizers"].is_array(),
             "tokenizer file {}: pre_tokenizer Sequence has no pretokenizers array", path);
    steps.clear();
    for (const json& step : pre["pretokenizers"]) steps.push_back(step);
  }
  const auto unsupported = [&](const json& step) {
    return Error(
        fmt::format("tokenizer file {}: pre_tokenizer step {} is not supported (only ByteLevel, or "
                    "BLOOM's Split then ByteLevel)",
                    path, describe_step(step)));
  };
  PreTokenizerConfig config;
  const json* byte_level = nullptr;
  if (steps.size() == 1 && type_of(steps[0]) == "ByteLevel") {
    byte_level = &steps[0];
    config.split = byte_level->value("use_regex", true) ? TextSplit::kGpt2Regex : TextSplit::kNone;
  } else if (steps.size() == 2 && type_of(steps[0]) == "Split" && type_of(steps[1]) == "ByteLevel") {
    const json& split = steps[0];
    const bool bloom = split.contains("pattern") && split["pattern"].is_object() &&
                       split["pattern"].value("Regex", std::string()) == kBloomSplitPattern &&
                       split.value("behavior", std::string()) == "Isolated" && !split.value("invert", false);
    if (!bloom) throw unsupported(split);
    byte_level = &steps[1];
    GA_CHECK(!byte_level->value("use_regex", true),
             "tokenizer file {}: a ByteLevel step with use_regex after a Split is not supported", path);
    config.split = TextSplit::kBloomRegex;
  } else {
    for (const json& step : steps) {
      if (type_of(step) != "ByteLevel") throw unsupported(step);
    }
    throw Error(
        fmt::format("tokenizer file {}: pre_tokenizer Sequence of {} steps is not supported", path, steps.size()));
  }
  config.add_prefix_space = byte_level->value("add_prefix_space", false);
  return config;
}

}  // namespace

Tokenizer::Tokenizer(std::string source, ByteLevelBpe bpe) : source_(std::move(source)), bpe_(std::move(bpe)) {}

Tokenizer Tokenizer::load(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "tokenizer.json", ec)) return from_hf_json((p / "tokenizer.json").string());
    if (fs::exists(p / "gpt2.tiktoken", ec)) return from_tiktoken((p / "gpt2.tiktoken").string());
    GA_CHECK(fs::exists(p / "encoder.json", ec) || fs::exists(p / "vocab.bpe", ec),
             "tokenizer directory {} holds none of tokenizer.json, gpt2.tiktoken, or encoder.json "
             "and vocab.bpe",
             path);
    return from_gpt2_files((p / "encoder.json").string(), (p / "vocab.bpe").string());
  }
  GA_CHECK(fs::exists(p, ec), "tokenizer path {} does not exist", path);
  if (p.extension() == ".tiktoken") return from_tiktoken(path);
  return from_hf_json(path);
}

Tokenizer Tokenizer::from_gpt2_files(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
  const auto vocab = read_vocab(parse_json(encoder_json_path), encoder_json_path, "the top level");
  const auto merges = read_vocab_bpe(vocab_bpe_path);
  const std::string source = encoder_json_path + " + " + vocab_bpe_path;
  Tokenizer tokenizer(source, ByteLevelBpe(vocab, merges, source));
  tokenizer.spaces_ = SpaceDefinition::kUnicodeWhiteSpace;
  if (const auto eot = tokenizer.token_id(kGpt2EndOfText)) {
    tokenizer.added_.push_back({*eot, kGpt2EndOfText, true});
  }
  return tokenizer;
}

Tokenizer Tokenizer::from_tiktoken(const std::string& path) {
  const std::vector<TiktokenToken> tokens = parse_tiktoken_ranks(read_tokenizer_file(path), path);
  std::vector<std::pair<std::string_view, TokenId>> bytes_and_ids;
  bytes_and_ids.reserve(tokens.size());
  for (const TiktokenToken& t : tokens) bytes_and_ids.emplace_back(t.bytes, t.rank);
  Tokenizer tokenizer(path, ByteLevelBpe(bytes_and_ids, tiktoken_merges(tokens, path), path));
  tokenizer.spaces_ = SpaceDefinition::kUnicodeWhiteSpace;
  tokenizer.bpe_.add_literal_token(kGpt2EndOfTextId, kGpt2EndOfText);
  tokenizer.added_.push_back({kGpt2EndOfTextId, kGpt2EndOfText, true});
  return tokenizer;
}

Tokenizer Tokenizer::from_hf_json(const std::string& path) {
  // The checks below name each expected field; a value of an unexpected JSON
  // type that slips past them (e.g. a numeric "type", found by fuzzing) still
  // becomes a one-line error naming the file, not an uncaught exception.
  try {
    return from_hf_json_checked(path);
  } catch (const json::exception& e) {
    throw Error(fmt::format("tokenizer file {}: unexpected JSON structure ({})", path, e.what()));
  }
}

Tokenizer Tokenizer::from_hf_json_checked(const std::string& path) {
  const json root = parse_json(path);
  GA_CHECK(root.is_object() && root.contains("model") && root["model"].is_object(),
           "tokenizer file {} has no \"model\" object", path);
  const json& model = root["model"];
  const std::string type = model.value("type", std::string());
  GA_CHECK(type == "BPE" || (type.empty() && model.contains("merges")),
           "tokenizer file {}: model type {} is not supported (only BPE)", path, type.empty() ? "(none)" : type);
  GA_CHECK(model.contains("vocab") && model.contains("merges"), "tokenizer file {}: model lacks vocab or merges", path);
  GA_CHECK(is_null_or_empty(model, "dropout"), "tokenizer file {}: BPE dropout is not supported", path);
  GA_CHECK(is_null_or_empty(model, "continuing_subword_prefix") && is_null_or_empty(model, "end_of_word_suffix"),
           "tokenizer file {}: continuing_subword_prefix and end_of_word_suffix are not supported", path);
  GA_CHECK(!model.value("byte_fallback", false), "tokenizer file {}: byte_fallback is not supported", path);
  GA_CHECK(is_null_or_empty(root, "normalizer"), "tokenizer file {}: normalizer {} is not supported", path,
           type_of(root["normalizer"]));

  const PreTokenizerConfig pre = read_pre_tokenizer(root, path);

  const auto vocab = read_vocab(model["vocab"], path, "model.vocab");
  const auto merges = read_hf_merges(model["merges"], path);
  Tokenizer tokenizer(path, ByteLevelBpe(vocab, merges, path));
  tokenizer.split_ = pre.split;
  tokenizer.add_prefix_space_ = pre.add_prefix_space;
  tokenizer.spaces_ = SpaceDefinition::kUnicodeWhiteSpace;

  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const json& added = root["added_tokens"];
    GA_CHECK(added.is_array(), "tokenizer file {}: added_tokens is not an array", path);
    for (std::size_t i = 0; i < added.size(); ++i) {
      const json& t = added[i];
      GA_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer() && t.contains("content") &&
                   t["content"].is_string() && !t["content"].get<std::string>().empty(),
               "tokenizer file {}: added_tokens[{}] needs an integer id and a non-empty content", path, i);
      AddedToken token{t["id"].get<TokenId>(), t["content"].get<std::string>(), t.value("special", false)};
      tokenizer.bpe_.add_literal_token(token.id, token.content);
      tokenizer.added_.push_back(std::move(token));
    }
  }
  for (std::size_t i = 0; i < tokenizer.added_.size(); ++i) tokenizer.matched_added_.push_back(i);
  std::stable_sort(tokenizer.matched_added_.begin(), tokenizer.matched_added_.end(), [&](std::size_t a, std::size_t b) {
    return tokenizer.added_[a].content.size() > tokenizer.added_[b].content.size();
  });
  return tokenizer;
}

void Tokenizer::encode_plain(std::string_view text, std::vector<TokenId>& ids) const {
  if (text.empty()) return;
  std::u32string code_points = decode_utf8(text);
  // Hugging Face's ByteLevel step adds the space to each piece it receives,
  // before its own regex: the whole text here, or each piece of BLOOM's Split.
  const bool prefix_pieces = add_prefix_space_ && split_ == TextSplit::kBloomRegex;
  if (add_prefix_space_ && !prefix_pieces && code_points.front() != U' ') code_points.insert(0, 1, U' ');
  std::string piece;
  const auto encode_span = [&](const TextSpan& span) {
    piece.clear();
    if (prefix_pieces && code_points[span.begin] != U' ') piece.push_back(' ');
    for (std::size_t i = span.begin; i < span.end; ++i) append_utf8(piece, code_points[i]);
    bpe_.encode_piece(piece, ids);
  };
  switch (split_) {
    case TextSplit::kGpt2Regex:
      for (const TextSpan& span : gpt2_pretokenize(code_points, spaces_)) encode_span(span);
      break;
    case TextSplit::kBloomRegex:
      for (const TextSpan& span : bloom_pretokenize(code_points)) encode_span(span);
      break;
    case TextSplit::kNone:
      encode_span({0, code_points.size()});
      break;
  }
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 1);
  if (matched_added_.empty()) {
    encode_plain(text, ids);
    return ids;
  }
  // Split out added tokens (leftmost, then longest), encode the text between.
  std::size_t plain_begin = 0;
  for (std::size_t i = 0; i < text.size();) {
    const AddedToken* found = nullptr;
    for (std::size_t index : matched_added_) {
      const AddedToken& t = added_[index];
      if (text.compare(i, t.content.size(), t.content) == 0) {
        found = &t;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    encode_plain(text.substr(plain_begin, i - plain_begin), ids);
    ids.push_back(found->id);
    i += found->content.size();
    plain_begin = i;
  }
  encode_plain(text.substr(plain_begin), ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids) const { return bpe_.decode(ids); }

}  // namespace gradaccum::data
