#include "gradaccum/io/grad_flow_writer.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "gradaccum/io/metrics_writer.h"

namespace gradaccum::io {

GradFlowWriter::GradFlowWriter(const std::string& output_dir, int64_t resumed_at_step)
    : out_((std::filesystem::path(output_dir) / "grad_flow.jsonl").string(), resumed_at_step) {}

void GradFlowWriter::on_grad_flow(const core::GradFlowRecord& r) {
  nlohmann::json parameters = nlohmann::json::array();
  for (size_t i = 0; i < r.names.size(); ++i) {
    parameters.push_back({{"name", r.names[i]},
                          {"mean_abs", r.mean_abs[i]},
                          {"max_abs", r.max_abs[i]},
                          {"zero_fraction", r.zero_fraction[i]}});
  }
  out_.append({{"step", r.step}, {"parameters", parameters}});
}

}  // namespace gradaccum::io
