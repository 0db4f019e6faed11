// The names of an enum's values, written once: `to_string`, the parser and the key table's choices
// all read the same table, so a new value is one entry and the three cannot disagree.
//
//   const base::EnumNames<LastWindow>& last_window_names() {
//     static const base::EnumNames<LastWindow> names{
//         {LastWindow::partial, "partial"}, {LastWindow::drop, "drop"}, {LastWindow::carry, "carry"}};
//     return names;
//   }
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "gradaccum/base/check.h"

namespace gradaccum::base {

template <typename E>
class EnumNames {
 public:
  struct Entry {
    E value;
    std::string name;
  };

  EnumNames(std::initializer_list<Entry> entries) : entries_(entries) {}

  // The value's name; a value missing from the table is a programming error.
  const std::string& name(E value) const {
    for (const auto& entry : entries_) {
      if (entry.value == value) return entry.name;
    }
    throw Error(fmt::format("enum value {} has no name", static_cast<long long>(value)));
  }

  std::optional<E> find(const std::string& name) const {
    for (const auto& entry : entries_) {
      if (entry.name == name) return entry.value;
    }
    return std::nullopt;
  }

  // The value called `name`; "<what>: '<name>' is not one of a | b | c" otherwise.
  E parse(const std::string& name, const std::string& what) const {
    if (const auto value = find(name)) return *value;
    throw Error(fmt::format("{}: '{}' is not one of {}", what, name, fmt::join(names(), " | ")));
  }

  // Every name, in table order (the key table's choices).
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& entry : entries_) out.push_back(entry.name);
    return out;
  }

 private:
  std::vector<Entry> entries_;
};

}  // namespace gradaccum::base
