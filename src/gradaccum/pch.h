// Precompiled header: the heavy, stable headers every translation unit uses.
#pragma once
#include <torch/torch.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (its own header since fmt 11)
#include <nlohmann/json.hpp>
