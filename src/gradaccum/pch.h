// Precompiled header: the heavy, stable headers every translation unit uses.
#pragma once
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (its own header since fmt 11)
#include <torch/torch.h>

#include <nlohmann/json.hpp>
