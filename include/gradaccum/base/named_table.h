// Tables of named entries (models::model_types(), io::data_types()): the lookup by name and the
// list of names, written once. A missing name is a gradaccum::Error naming the configuration key
// and every choice, so the table itself is the list of what is allowed.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

#include "gradaccum/base/check.h"

namespace gradaccum::base {

// The names of a table's entries (each has a `name`), in table order.
template <typename Table>
std::vector<std::string> names_of(const Table& table) {
  std::vector<std::string> names;
  for (const auto& entry : table) names.push_back(entry.name);
  return names;
}

// The entry called `name`; "key '<key>': '<name>' is not one of a | b | c" otherwise.
template <typename Table>
const auto& find_named(const Table& table, const std::string& name, const char* key) {
  for (const auto& entry : table) {
    if (entry.name == name) return entry;
  }
  throw Error(fmt::format("key '{}': '{}' is not one of {}", key, name, fmt::join(names_of(table), " | ")));
}

}  // namespace gradaccum::base
