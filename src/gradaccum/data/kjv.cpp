#include "gradaccum/data/kjv.h"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "gradaccum/base/check.h"
#include "gradaccum/data/data_split.h"
#include "gradaccum/data/text_lines.h"

namespace gradaccum::data {
namespace {

constexpr const char* kInstallHint = "install it with `apt install bible-kjv bible-kjv-text`";
constexpr const char* kRange = "Gen1:1-Rev22:21";

// The 66 books as `bible` abbreviates them, in canonical order; the first 39
// are the Old Testament.
constexpr std::array<const char*, 66> kBooks = {
    "Ge",   "Exo",  "Lev",  "Num",   "Deu",  "Josh",  "Jdgs", "Ruth", "1Sm",  "2Sm", "1Ki", "2Ki",  "1Chr", "2Chr",
    "Ezra", "Neh",  "Est",  "Job",   "Psa",  "Prv",   "Eccl", "SSol", "Isa",  "Jer", "Lam", "Eze",  "Dan",  "Hos",
    "Joel", "Amos", "Obad", "Jonah", "Mic",  "Nahum", "Hab",  "Zep",  "Hag",  "Zec", "Mal", "Mat",  "Mark", "Luke",
    "John", "Acts", "Rom",  "1Cor",  "2Cor", "Gal",   "Eph",  "Phi",  "Col",  "1Th", "2Th", "1Tim", "2Tim", "Titus",
    "Phmn", "Heb",  "Jas",  "1Pet",  "2Pet", "1Jn",   "2Jn",  "3Jn",  "Jude", "Rev"};
constexpr std::size_t kOldTestamentBooks = 39;

int book_index(std::string_view name) {
  for (std::size_t b = 0; b < kBooks.size(); ++b)
    if (name == kBooks[b]) return static_cast<int>(b);
  return -1;
}

bool all_digits(std::string_view s) {
  return !s.empty() && s.size() < 5 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string excerpt(std::string_view line) {
  std::string s(line.substr(0, 60));
  for (auto& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return line.size() > 60 ? s + "..." : s;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

TokenId endoftext_or(TokenId id, const Tokenizer& tokenizer, const char* key) {
  if (id >= 0) return id;
  const auto eot = tokenizer.token_id("<|endoftext|>");
  GA_CHECK(eot.has_value(), "tokenizer {} has no <|endoftext|> token; set {} explicitly", tokenizer.source(), key);
  return *eot;
}

std::vector<std::vector<TokenId>> encode_verses(const std::vector<Verse>& verses, const std::vector<int64_t>& which,
                                                const Tokenizer& tokenizer) {
  std::vector<std::vector<TokenId>> docs;
  docs.reserve(which.size());
  for (auto i : which) docs.push_back(tokenizer.encode(verses[i].text));
  return docs;
}

}  // namespace

std::string verse_reference(const Verse& v) { return fmt::format("{}{}:{}", v.book, v.chapter, v.verse); }

std::vector<Verse> parse_kjv_listing(std::string_view listing, const std::string& source) {
  std::vector<Verse> verses;
  int previous_book = 0;
  for_each_line(listing, [&](int64_t number, std::string_view line) {
    // "<book><chapter>:<verse> <text>"; book names never end in a digit ("1Sm").
    const auto space = line.find(' ');
    const auto reference = line.substr(0, space);
    const auto colon = reference.find(':');
    auto digits = colon == std::string_view::npos ? 0 : colon;
    while (digits > 0 && reference[digits - 1] >= '0' && reference[digits - 1] <= '9') --digits;
    const int book = colon == std::string_view::npos ? -1 : book_index(reference.substr(0, digits));
    const bool ok = space != std::string_view::npos && space + 1 < line.size() && book >= 0 && book >= previous_book &&
                    all_digits(reference.substr(digits, colon - digits)) && all_digits(reference.substr(colon + 1));
    GA_CHECK(ok, "{}: line {} is not a verse in canonical order (\"{}\"); is the KJV text broken? {}", source, number,
             excerpt(line), kInstallHint);
    previous_book = book;
    Verse v;
    v.book = kBooks[book];
    v.chapter = std::stoi(std::string(reference.substr(digits, colon - digits)));
    v.verse = std::stoi(std::string(reference.substr(colon + 1)));
    v.text = std::string(line.substr(space + 1));
    v.testament = static_cast<std::size_t>(book) < kOldTestamentBooks ? 0 : 1;
    verses.push_back(std::move(v));
  });
  return verses;
}

std::vector<Verse> load_kjv(const std::string& program) {
  const std::string command = fmt::format("{} -f {}", program, kRange);
  const std::string shell = shell_quote(program) + " -f " + kRange + " 2>/dev/null";
  FILE* pipe = ::popen(shell.c_str(), "r");
  GA_CHECK(pipe != nullptr, "cannot run `{}`: {}; {}", command, std::strerror(errno), kInstallHint);
  std::string listing;
  std::array<char, 1 << 16> buffer;
  for (std::size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) listing.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  GA_CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 127), "`{}`: {} not found; {}", command, program,
           kInstallHint);
  GA_CHECK(
      WIFEXITED(status) && WEXITSTATUS(status) == 0, "`{}` failed ({}); {}", command,
      WIFEXITED(status) ? fmt::format("exit status {}", WEXITSTATUS(status)) : fmt::format("wait status {}", status),
      kInstallHint);
  GA_CHECK(!listing.empty(), "`{}` printed nothing; {}", command, kInstallHint);

  auto verses = parse_kjv_listing(listing, "`" + command + "`");
  int64_t old_testament = 0;
  for (const auto& v : verses) old_testament += v.testament == 0;
  const auto total = static_cast<int64_t>(verses.size());
  GA_CHECK(total == kKjvVerses && old_testament == kKjvOldTestamentVerses,
           "`{}` printed {} verses ({} Old, {} New Testament), expected {} ({} + {}); {}", command, total,
           old_testament, total - old_testament, kKjvVerses, kKjvOldTestamentVerses, kKjvNewTestamentVerses,
           kInstallHint);
  return verses;
}

CausalLmData make_kjv_lm_data(const Tokenizer& tokenizer, const KjvLmOptions& options) {
  return make_kjv_lm_data(load_kjv(options.program), tokenizer, options);
}

CausalLmData make_kjv_lm_data(const std::vector<Verse>& verses, const Tokenizer& tokenizer,
                              const KjvLmOptions& options) {
  LmDatasetOptions dataset = options.dataset;
  dataset.pad_token_id = endoftext_or(dataset.pad_token_id, tokenizer, "pad_token_id");
  dataset.eos_token_id = endoftext_or(dataset.eos_token_id, tokenizer, "eos_token_id");
  const auto split = interleaved_split(static_cast<int64_t>(verses.size()), options.eval_fraction);
  CausalLmData data;
  data.train = std::make_shared<CausalLmDataset>(encode_verses(verses, split.train, tokenizer), dataset);
  if (!split.eval.empty())
    data.eval = std::make_shared<CausalLmDataset>(encode_verses(verses, split.eval, tokenizer), dataset);
  return data;
}

ClassificationData make_kjv_testament_data(const Tokenizer& tokenizer, const KjvTestamentOptions& options) {
  return make_kjv_testament_data(load_kjv(options.program), tokenizer, options);
}

ClassificationData make_kjv_testament_data(const std::vector<Verse>& verses, const Tokenizer& tokenizer,
                                           const KjvTestamentOptions& options) {
  ClassificationDatasetOptions dataset;
  dataset.max_length = options.max_length;
  dataset.pad_token_id = endoftext_or(options.pad_token_id, tokenizer, "pad_token_id");
  dataset.num_labels = 2;
  std::vector<int64_t> labels;
  labels.reserve(verses.size());
  for (const auto& v : verses) labels.push_back(v.testament);

  auto make = [&](std::vector<int64_t> which) {
    if (options.balanced) which = balance_classes(which, labels, options.seed);
    auto ids = encode_verses(verses, which, tokenizer);
    std::vector<LabelledTokens> examples(which.size());
    for (std::size_t k = 0; k < which.size(); ++k) examples[k] = {std::move(ids[k]), labels[which[k]]};
    return std::make_shared<SequenceClassificationDataset>(examples, dataset);
  };
  auto split = interleaved_split(static_cast<int64_t>(verses.size()), options.eval_fraction);
  ClassificationData data;
  data.num_labels = 2;
  data.train = make(std::move(split.train));
  if (!split.eval.empty()) data.eval = make(std::move(split.eval));
  return data;
}

}  // namespace gradaccum::data
