#include "gradaccum/data/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <forward_list>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gradaccum/base/check.h"
#include "gradaccum/data/added_token_split.h"
#include "gradaccum/data/gguf_tokenizer.h"
#include "gradaccum/data/normalizer.h"
#include "gradaccum/data/pre_tokenizer.h"
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

std::string json_quoted(const std::string& token) {
  return json(token).dump(-1, ' ', false, json::error_handler_t::replace);
}

// A file's ids index tables of one entry per id: an id far beyond the number of
// tokens it holds would allocate for nothing (2·10^9 is 64 GB of strings), so
// ids must stay below twice that number plus this many.
constexpr TokenId kSpareIds = 1024;

TokenId id_limit(std::size_t tokens) { return 2 * static_cast<TokenId>(tokens) + kSpareIds; }

void check_id_in_range(TokenId id, std::size_t tokens, const std::string& path, const std::string& where,
                       const std::string& token) {
  GA_CHECK(id >= 0, "tokenizer file {}: {}: token {} has the negative id {}", path, where, json_quoted(token), id);
  GA_CHECK(id < id_limit(tokens),
           "tokenizer file {}: {}: token {} has id {}, far beyond the {} tokens the file holds (ids must be below {})",
           path, where, json_quoted(token), id, tokens, id_limit(tokens));
}

// id values of a {"token": id, ...} object; extra_tokens more tokens (added
// tokens) come with it, which the ids may also leave room for.
std::unordered_map<std::string, TokenId> read_vocab(const json& object, const std::string& path, const char* where,
                                                    std::size_t extra_tokens = 0) {
  GA_CHECK(object.is_object(), "tokenizer file {}: {} is not a JSON object of token ids", path, where);
  std::unordered_map<std::string, TokenId> vocab;
  vocab.reserve(object.size());
  std::unordered_map<TokenId, std::string> token_of;
  token_of.reserve(object.size());
  for (const auto& [token, id] : object.items()) {
    GA_CHECK(id.is_number_integer(), "tokenizer file {}: {}: the id of token {} is not an integer", path, where,
             json_quoted(token));
    const TokenId value = id.get<TokenId>();
    check_id_in_range(value, object.size() + extra_tokens, path, where, token);
    const auto [other, fresh] = token_of.emplace(value, token);
    GA_CHECK(fresh, "tokenizer file {}: {}: tokens {} and {} have the same id {}", path, where,
             json_quoted(other->second), json_quoted(token), value);
    vocab.emplace(token, value);
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

// tokenizer.json's added_tokens, checked against model.vocab: an added token
// that is in the vocabulary has its id there, and no two tokens share an id.
std::vector<AddedToken> read_added_tokens(const json& root, const std::unordered_map<std::string, TokenId>& vocab,
                                          const std::string& path) {
  std::vector<AddedToken> tokens;
  if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return tokens;
  const json& added = root["added_tokens"];
  GA_CHECK(added.is_array(), "tokenizer file {}: added_tokens is not an array", path);
  std::unordered_map<TokenId, std::string> vocab_token_of;
  vocab_token_of.reserve(vocab.size());
  for (const auto& [token, id] : vocab) vocab_token_of.emplace(id, token);
  std::unordered_map<TokenId, std::size_t> added_index_of;
  std::unordered_map<std::string, std::size_t> added_content_of;
  for (std::size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    GA_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer() && t.contains("content") &&
                 t["content"].is_string() && !t["content"].get<std::string>().empty(),
             "tokenizer file {}: added_tokens[{}] needs an integer id and a non-empty content", path, i);
    const auto flag = [&](const char* key, bool fallback) {
      if (!t.contains(key) || t[key].is_null()) return fallback;
      GA_CHECK(t[key].is_boolean(), "tokenizer file {}: added_tokens[{}].{} is not true or false", path, i, key);
      return t[key].get<bool>();
    };
    AddedToken token{t["id"].get<TokenId>(), t["content"].get<std::string>()};
    token.special = flag("special", false);
    token.single_word = flag("single_word", false);
    token.lstrip = flag("lstrip", false);
    token.rstrip = flag("rstrip", false);
    // tokenizers' default: special tokens are matched before normalization.
    token.normalized = flag("normalized", !token.special);
    const std::string where = fmt::format("added_tokens[{}]", i);
    check_id_in_range(token.id, vocab.size() + added.size(), path, where, token.content);
    const auto in_vocab = vocab.find(token.content);
    GA_CHECK(in_vocab == vocab.end() || in_vocab->second == token.id,
             "tokenizer file {}: {}: token {} has id {}, but model.vocab gives it id {}", path, where,
             json_quoted(token.content), token.id, in_vocab == vocab.end() ? 0 : in_vocab->second);
    const auto vocab_token = vocab_token_of.find(token.id);
    GA_CHECK(vocab_token == vocab_token_of.end() || vocab_token->second == token.content,
             "tokenizer file {}: {}: tokens {} and {} (model.vocab) have the same id {}", path, where,
             json_quoted(token.content), json_quoted(vocab_token == vocab_token_of.end() ? "" : vocab_token->second),
             token.id);
    const auto [same_id, fresh_id] = added_index_of.emplace(token.id, i);
    GA_CHECK(fresh_id, "tokenizer file {}: {}: tokens {} and {} (added_tokens[{}]) have the same id {}", path, where,
             json_quoted(token.content), json_quoted(tokens[same_id->second].content), same_id->second, token.id);
    const auto [same_content, fresh_content] = added_content_of.emplace(token.content, i);
    GA_CHECK(fresh_content, "tokenizer file {}: {}: token {} is already added_tokens[{}]", path, where,
             json_quoted(token.content), same_content->second);
    tokens.push_back(std::move(token));
  }
  return tokens;
}

}  // namespace

Tokenizer::Tokenizer(std::string source, ByteLevelBpe bpe, std::shared_ptr<const PreTokenizer> pre_tokenizer)
    : source_(std::move(source)), bpe_(std::move(bpe)), pre_tokenizer_(std::move(pre_tokenizer)) {}

namespace {

std::shared_ptr<const PreTokenizer> gpt2_pre_tokenizer() {
  static const auto pre = std::make_shared<const PreTokenizer>(PreTokenizer::gpt2());
  return pre;
}

}  // namespace

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
  if (p.extension() == ".gguf") return from_gguf(path);
  return from_hf_json(path);
}

Tokenizer Tokenizer::from_gpt2_files(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
  const auto vocab = read_vocab(parse_json(encoder_json_path), encoder_json_path, "the top level");
  const auto merges = read_vocab_bpe(vocab_bpe_path);
  const std::string source = encoder_json_path + " + " + vocab_bpe_path;
  Tokenizer tokenizer(source, ByteLevelBpe(vocab, merges, source), gpt2_pre_tokenizer());
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
  Tokenizer tokenizer(path, ByteLevelBpe(bytes_and_ids, tiktoken_merges(tokens, path), path), gpt2_pre_tokenizer());
  tokenizer.bpe_.add_literal_token(kGpt2EndOfTextId, kGpt2EndOfText);
  tokenizer.added_.push_back({kGpt2EndOfTextId, kGpt2EndOfText, true});
  return tokenizer;
}

Tokenizer Tokenizer::from_hf_json(const std::string& path) {
  // The checks below name each expected field; a value of an unexpected JSON
  // type that slips past them (e.g. a numeric "type", found by fuzzing) still
  // becomes a one-line error naming the file, not an uncaught exception.
  try {
    return from_hf_json_checked(parse_json(path), path);
  } catch (const json::exception& e) {
    throw Error(fmt::format("tokenizer file {}: unexpected JSON structure ({})", path, e.what()));
  }
}

Tokenizer Tokenizer::from_gguf(const std::string& gguf_path) {
  const auto file = formats::GgufFile::open(gguf_path);
  try {
    return from_hf_json_checked(gguf_tokenizer_json(file), gguf_path);
  } catch (const json::exception& e) {
    throw Error(fmt::format("tokenizer file {}: unexpected tokenizer metadata ({})", gguf_path, e.what()));
  }
}

Tokenizer Tokenizer::from_hf_json_checked(const nlohmann::json& root, const std::string& path) {
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
  std::optional<Normalizer> normalizer;
  if (!is_null_or_empty(root, "normalizer")) normalizer = Normalizer::from_json(root["normalizer"], path);

  const json decoder = root.value("decoder", json());
  GA_CHECK(decoder.is_null() || type_of(decoder) == "ByteLevel",
           "tokenizer file {}: decoder {} is not supported (only ByteLevel)", path, type_of(decoder));
  GA_CHECK(model.value("ignore_merges", json(false)).is_boolean(),
           "tokenizer file {}: model.ignore_merges is not true or false", path);

  auto pre = std::make_shared<const PreTokenizer>(PreTokenizer::from_json(root.value("pre_tokenizer", json()), path));

  const std::size_t added_count =
      root.contains("added_tokens") && root["added_tokens"].is_array() ? root["added_tokens"].size() : 0;
  const auto vocab = read_vocab(model["vocab"], path, "model.vocab", added_count);
  std::vector<AddedToken> added = read_added_tokens(root, vocab, path);
  const auto merges = read_hf_merges(model["merges"], path);
  Tokenizer tokenizer(path, ByteLevelBpe(vocab, merges, path), std::move(pre));
  if (model.value("ignore_merges", false)) tokenizer.bpe_.ignore_merges();
  // tokenizers' BPE without an unk_token leaves out what has no id.
  if (is_null_or_empty(model, "unk_token")) tokenizer.bpe_.drop_unknown_bytes();
  for (const AddedToken& token : added) tokenizer.bpe_.add_literal_token(token.id, token.content);
  if (normalizer) tokenizer.normalizer_ = std::make_shared<const Normalizer>(*normalizer);
  tokenizer.added_ = std::move(added);
  if (!tokenizer.added_.empty()) {
    // tokenizers finds a normalized token's content as the normalizer writes it.
    std::vector<AddedToken> found_as = tokenizer.added_;
    for (AddedToken& token : found_as) {
      if (token.normalized && normalizer) token.content = normalizer->apply(token.content);
    }
    tokenizer.added_splitter_ = std::make_shared<const AddedTokenSplitter>(found_as);
  }
  return tokenizer;
}

void Tokenizer::encode_plain(std::string_view text, std::vector<TokenId>& ids) const {
  // One buffer per thread: encode runs once per line of a data set.
  thread_local std::vector<std::string> pieces;
  pieces.clear();
  pre_tokenizer_->split(text, pieces);
  for (const std::string& piece : pieces) bpe_.encode_piece(piece, ids);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 1);
  std::string replaced;
  if (!is_valid_utf8(text)) {
    replaced = replace_invalid_utf8(text);
    text = replaced;
  }
  // The normalizer's output for the sections it changes; the sections' views point into it.
  std::forward_list<std::string> normalized;  // nothing allocated unless a section changes
  const AddedTokenSplitter::Normalize normalize = [&](std::string_view section) -> std::string_view {
    return Normalizer::leaves_alone(section) ? section : normalized.emplace_front(normalizer_->apply(section));
  };
  if (added_splitter_ == nullptr) {
    encode_plain(normalizer_ != nullptr ? normalize(text) : text, ids);
    return ids;
  }
  std::vector<TextSection> sections;
  added_splitter_->split(text, sections, normalizer_ != nullptr ? &normalize : nullptr);
  for (const TextSection& section : sections) {
    if (section.id) {
      ids.push_back(*section.id);
    } else {
      encode_plain(section.text, ids);
    }
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids) const { return bpe_.decode(ids); }

}  // namespace gradaccum::data
