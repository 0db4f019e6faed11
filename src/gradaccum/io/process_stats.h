// Figures about this process that the metrics report.
#pragma once

namespace gradaccum::io {

// Peak resident set size of this process so far, in MiB (getrusage).
double peak_rss_mb();

}  // namespace gradaccum::io
