#include "gradaccum/dist/optimizer_reshard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <utility>

#include "gradaccum/base/check.h"
#include "gradaccum/dist/sharded_optimizer.h"

namespace gradaccum::dist {
namespace {

// "<param>" or "<param>[begin:end]", as named_shards() spells a range of a parameter.
struct Holder {
  std::string param;
  std::optional<std::pair<int64_t, int64_t>> range;
};

std::optional<int64_t> parse_count(const std::string& text) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::strtoll(text.c_str(), nullptr, 10);
}

Holder parse_holder(const std::string& holder, const std::string& key, const std::string& what) {
  if (holder.empty() || holder.back() != ']') return {holder, std::nullopt};
  const auto open = holder.rfind('[');
  const auto colon = holder.find(':', open == std::string::npos ? 0 : open);
  GA_CHECK(open != std::string::npos && open > 0 && colon != std::string::npos,
           "{}: optimizer state {} names no range [begin:end]", what, key);
  const auto begin = parse_count(holder.substr(open + 1, colon - open - 1));
  const auto end = parse_count(holder.substr(colon + 1, holder.size() - colon - 2));
  GA_CHECK(begin && end && *begin < *end, "{}: optimizer state {} names no range [begin:end] with begin < end", what,
           key);
  return {holder.substr(0, open), std::pair{*begin, *end}};
}

// The pieces of one field of one parameter, as saved.
struct FieldPieces {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<torch::Tensor> values;  // flattened, one per range
};

}  // namespace

optim::NamedStateTensors join_optimizer_state(const std::vector<optim::NamedStateTensors>& parts,
                                              const optim::NamedParameters& params, const std::string& what) {
  std::map<std::string, const torch::Tensor*> by_name;
  for (const auto& [name, p] : params) by_name.emplace(name, &p);
  std::map<std::string, int64_t> steps;
  std::map<std::string, std::map<std::string, FieldPieces>> fields;  // param → field → pieces
  for (const auto& part : parts) {
    for (const auto& [key, tensor] : part) {
      const auto dot = key.rfind('.');
      GA_CHECK(dot != std::string::npos && dot > 0, "{}: optimizer state {} names no parameter", what, key);
      const auto holder = parse_holder(key.substr(0, dot), key, what);
      const auto it = by_name.find(holder.param);
      GA_CHECK(it != by_name.end(), "{}: optimizer state {} belongs to no parameter of this model", what, key);
      const int64_t numel = it->second->numel();
      const auto field = key.substr(dot + 1);
      if (field == "step") {
        GA_CHECK(tensor.dim() == 0 && tensor.scalar_type() == torch::kLong,
                 "{}: optimizer state {} is not an int64 "
                 "scalar",
                 what, key);
        const auto step = tensor.item<int64_t>();
        const auto [at, fresh] = steps.emplace(holder.param, step);
        GA_CHECK(fresh || at->second == step, "{}: the saved parts of {} disagree on its step ({} and {})", what,
                 holder.param, at->second, step);
        continue;
      }
      const auto range = holder.range.value_or(std::pair<int64_t, int64_t>{0, numel});
      GA_CHECK(range.second <= numel, "{}: optimizer state {} reaches past the {} elements of {}", what, key, numel,
               holder.param);
      GA_CHECK(tensor.numel() == range.second - range.first, "{}: optimizer state {} holds {} elements, its range {}",
               what, key, tensor.numel(), range.second - range.first);
      auto& pieces = fields[holder.param][field];
      pieces.ranges.push_back(range);
      pieces.values.push_back(tensor.reshape({-1}));
    }
  }

  optim::NamedStateTensors whole;
  for (const auto& [name, p] : params) {
    const auto found = fields.find(name);
    if (found == fields.end()) {
      // A parameter never stepped has no state; a step alone means a lost field.
      GA_CHECK(steps.count(name) == 0, "{}: the saved parts of {} hold its step but no state", what, name);
      continue;
    }
    if (const auto step = steps.find(name); step != steps.end()) {
      whole.emplace_back(name + ".step", torch::full({}, step->second, torch::kLong));
    }
    for (const auto& [field, pieces] : found->second) {
      // Sorted by begin, the ranges must tile [0, numel) exactly.
      std::vector<size_t> order(pieces.ranges.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(),
                [&](size_t a, size_t b) { return pieces.ranges[a].first < pieces.ranges[b].first; });
      int64_t covered = 0;
      std::vector<torch::Tensor> in_order;
      for (const size_t i : order) {
        const int64_t begin = pieces.ranges[i].first;
        GA_CHECK(begin <= covered, "{}: the saved parts of {}.{} leave out element {}", what, name, field, covered);
        GA_CHECK(begin == covered, "{}: the saved parts of {}.{} cover element {} twice", what, name, field, begin);
        covered = pieces.ranges[i].second;
        in_order.push_back(pieces.values[i]);
      }
      GA_CHECK(covered == p.numel(), "{}: the saved parts of {}.{} cover {} of its {} elements", what, name, field,
               covered, p.numel());
      whole.emplace_back(name + "." + field, torch::cat(in_order).reshape(p.sizes()));
    }
  }
  return whole;
}

void load_resharded_optimizer_state(torch::optim::Optimizer& optimizer, const optim::NamedParameters& params,
                                    const std::vector<optim::NamedStateTensors>& parts, const std::string& what) {
  const auto whole = join_optimizer_state(parts, params, what);
  const auto* sharded = dynamic_cast<const ShardOwningOptimizer*>(&optimizer);
  if (sharded == nullptr) {
    load_named_optimizer_state(optimizer, params, whole, what);
    return;
  }
  // This rank's ranges of each parameter's state.
  std::map<std::string, std::map<std::string, torch::Tensor>> by_param;
  for (const auto& [key, tensor] : whole) {
    const auto dot = key.rfind('.');
    by_param[key.substr(0, dot)][key.substr(dot + 1)] = tensor;
  }
  optim::NamedStateTensors mine;
  if (sharded->shard_optimizer() != nullptr) {
    for (const auto& [shard, view] : sharded->named_shards(params)) {
      const auto holder = parse_holder(shard, shard, what);
      const auto found = by_param.find(holder.param);
      if (found == by_param.end()) continue;
      const auto [begin, end] = holder.range.value();
      for (const auto& [field, tensor] : found->second) {
        mine.emplace_back(shard + "." + field, field == "step" ? tensor : tensor.reshape({-1}).slice(0, begin, end));
      }
    }
  }
  load_named_optimizer_state(optimizer, params, mine, what);
}

}  // namespace gradaccum::dist
