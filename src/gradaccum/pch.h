// Precompiled header: the heavy, stable headers every translation unit uses.
#pragma once
#include <torch/torch.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
