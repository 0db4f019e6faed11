#include "gradaccum/cli/tokenize_command.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "gradaccum/base/check.h"
#include "gradaccum/data/tokenizer.h"
#include "gradaccum/io/workload.h"

namespace gradaccum::cli {
namespace {

std::vector<data::TokenId> parse_ids(const std::string& line, std::size_t line_no) {
  nlohmann::json array;
  try {
    array = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("input line {}: expected a JSON array of token ids", line_no));
  }
  GA_CHECK(array.is_array(), "input line {}: expected a JSON array of token ids", line_no);
  std::vector<data::TokenId> ids;
  ids.reserve(array.size());
  for (const auto& id : array) {
    GA_CHECK(id.is_number_integer(), "input line {}: {} is not a token id", line_no, id.dump());
    ids.push_back(id.get<data::TokenId>());
  }
  return ids;
}

}  // namespace

int run_tokenize(const TokenizeArgs& args) {
  const auto tokenizer = data::Tokenizer::load(io::tokenizer_directory(args.tokenizer_dir));

  std::ifstream file;
  std::istream* in = &std::cin;
  if (!args.input_path.empty() && args.input_path != "-") {
    file.open(args.input_path, std::ios::binary);
    GA_CHECK(file, "cannot open input file {}: {}", args.input_path, std::strerror(errno));
    in = &file;
  }

  std::string line, out;
  std::size_t line_no = 0;
  while (std::getline(*in, line)) {
    ++line_no;
    out.clear();
    if (args.decode) {
      out = tokenizer.decode(parse_ids(line, line_no));
    } else {
      out.push_back('[');
      bool first = true;
      for (data::TokenId id : tokenizer.encode(line)) {
        if (!first) out.push_back(',');
        first = false;
        fmt::format_to(std::back_inserter(out), "{}", id);
      }
      out.push_back(']');
    }
    out.push_back('\n');
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  GA_CHECK(!in->bad(), "cannot read {}", args.input_path.empty() ? "standard input" : args.input_path);
  GA_CHECK(std::fflush(stdout) == 0, "cannot write the output: {}", std::strerror(errno));
  return 0;
}

}  // namespace gradaccum::cli
