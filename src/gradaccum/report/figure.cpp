#include "gradaccum/report/figure.h"

#include <plplot.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>

#include "gradaccum/base/check.h"
#include "gradaccum/base/files.h"

namespace gradaccum::report {

namespace {

constexpr PLINT kBlack = 1, kGrey = 2, kFirstSeries = 3;
constexpr double kLegendScale = 0.7;
constexpr const char* kDot = "\u2022";  // a bullet; the cairo driver draws UTF-8 text

// PLplot reads '#' as the start of an escape sequence; "##" is a literal '#'.
std::string plplot_text(const std::string& text) {
  std::string out;
  for (char c : text) {
    out += c;
    if (c == '#') out += '#';
  }
  return out;
}

double transformed(double y, bool log_y) {
  if (!std::isfinite(y) || (log_y && y <= 0.0)) return std::numeric_limits<double>::quiet_NaN();
  return log_y ? std::log10(y) : y;
}

struct Range {
  double low = std::numeric_limits<double>::infinity(), high = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    low = std::min(low, v);
    high = std::max(high, v);
  }
  bool empty() const { return low > high; }
  // Widened by `fraction` of the span on each side; a single value gets a span of its own.
  Range padded(double fraction) const {
    if (empty()) return {0.0, 1.0};
    if (high == low) {
      const double half = low == 0.0 ? 1.0 : std::abs(low) * 0.1;
      return {low - half, high + half};
    }
    const double pad = (high - low) * fraction;
    return {low - pad, high + pad};
  }
};

// Tick labels of linear axes as %.4g: PLplot's own labels move a common factor into a
// "(x10^k)" above the axis, where it collides with the title.
void linear_tick_label(PLINT, PLFLT value, char* label, PLINT length, PLPointer) {
  if (std::abs(value) < 1e-300) value = 0.0;  // -0 and rounding residue at the origin
  std::snprintf(label, static_cast<size_t>(length), "%.4g", value);
}

// Draws the finite runs of (x, y) as lines: a point that is missing breaks the line.
void draw_runs(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<PLFLT> xs, ys;
  auto flush = [&] {
    if (xs.size() >= 2) plline(static_cast<PLINT>(xs.size()), xs.data(), ys.data());
    if (xs.size() == 1) plstring(1, xs.data(), ys.data(), kDot);
    xs.clear();
    ys.clear();
  };
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    if (std::isfinite(x[i]) && std::isfinite(y[i])) {
      xs.push_back(x[i]);
      ys.push_back(y[i]);
    } else {
      flush();
    }
  }
  flush();
}

void draw_points(const std::vector<double>& x, const std::vector<double>& y) {
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) continue;
    PLFLT px = x[i], py = y[i];
    plstring(1, &px, &py, kDot);
  }
}

// Bars of series `k` of `count` side by side around each category index.
void draw_bars(const std::vector<double>& x, const std::vector<double>& y, size_t k, size_t count, double floor) {
  const double width = 0.8 / static_cast<double>(count);
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    if (!std::isfinite(y[i]) || !std::isfinite(x[i])) continue;
    const double left = x[i] - 0.4 + width * static_cast<double>(k);
    PLFLT xs[4] = {left, left + width, left + width, left};
    PLFLT ys[4] = {floor, floor, y[i], y[i]};
    plfill(4, xs, ys);
  }
}

void draw_legend(const Panel& panel, const std::vector<PLINT>& colours, bool outside, double scale) {
  std::vector<PLINT> options, line_colours, line_styles, symbol_numbers, box_colours, box_patterns, text_colours;
  std::vector<PLFLT> line_widths, symbol_scales, box_scales, box_line_widths;
  std::vector<std::string> texts;
  std::vector<const char*> text_pointers, symbols;
  for (size_t k = 0; k < panel.series.size(); ++k) {
    const auto& s = panel.series[k];
    if (s.label.empty()) continue;
    PLINT option = PL_LEGEND_LINE;
    if (s.style == SeriesStyle::points) option = PL_LEGEND_SYMBOL;
    if (s.style == SeriesStyle::line_and_points) option = PL_LEGEND_LINE | PL_LEGEND_SYMBOL;
    if (s.style == SeriesStyle::bars) option = PL_LEGEND_COLOR_BOX;
    options.push_back(option);
    line_colours.push_back(colours[k]);
    line_styles.push_back(s.style == SeriesStyle::dashed_line ? 3 : 1);
    line_widths.push_back(2.0);
    symbol_numbers.push_back(1);
    symbol_scales.push_back(1.0);
    symbols.push_back(kDot);
    box_colours.push_back(colours[k]);
    box_patterns.push_back(0);
    box_scales.push_back(0.8);
    box_line_widths.push_back(1.0);
    text_colours.push_back(kBlack);
    texts.push_back(plplot_text(s.label));
  }
  if (texts.size() < 2) return;
  for (const auto& t : texts) text_pointers.push_back(t.c_str());
  PLFLT width = 0, height = 0;
  plschr(0.0, kLegendScale * scale);
  pllegend(
      &width, &height, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX,
      outside ? (PL_POSITION_RIGHT | PL_POSITION_OUTSIDE) : (PL_POSITION_TOP | PL_POSITION_RIGHT | PL_POSITION_INSIDE),
      0.01, outside ? 0.0 : 0.01, 0.05, 0, kBlack, 1, 0, 0, static_cast<PLINT>(texts.size()), options.data(), 1.0,
      kLegendScale * scale, 1.8, 0.0, text_colours.data(), text_pointers.data(), box_colours.data(),
      box_patterns.data(), box_scales.data(), box_line_widths.data(), line_colours.data(), line_styles.data(),
      line_widths.data(), line_colours.data(), symbol_scales.data(), symbol_numbers.data(), symbols.data());
  plschr(0.0, 1.0);
}

// The panel inside the normalized device rectangle [x0, x1] × [y0, y1].
void draw_panel(const Panel& panel, double x0, double x1, double y0, double y1, double page_width_mm,
                double page_height_mm, double scale) {
  plschr(0.0, scale);
  const bool categorical = !panel.x_categories.empty();
  Range xr, yr;
  std::vector<std::vector<double>> ys;
  for (const auto& s : panel.series) {
    ys.emplace_back();
    for (double y : s.y) ys.back().push_back(transformed(y, panel.log_y));
    for (double x : s.x) xr.add(x);
    for (double y : ys.back()) yr.add(y);
  }
  const bool has_bars = std::any_of(panel.series.begin(), panel.series.end(),
                                    [](const Series& s) { return s.style == SeriesStyle::bars; });
  // Margins in character heights (PLplot places text in those units), converted to the page's
  // normalized coordinates; category names stand perpendicular under the axis, the bottom margin
  // holds the longest, and a legend of more than three entries stands right of the panel.
  PLFLT default_mm = 0, char_mm = 0;
  plgchr(&default_mm, &char_mm);
  const double cx = char_mm / page_width_mm, cy = char_mm / page_height_mm;
  double label_scale = 1.0, bottom = 4.2 * cy;
  if (categorical) {
    size_t longest = 1;
    for (const auto& name : panel.x_categories) longest = std::max(longest, name.size());
    // The names take at most 40% of the panel's height: longer ones get a smaller font.
    const double room = 0.40 * (y1 - y0) / cy - 2.0;
    label_scale = std::clamp(room / (0.85 * static_cast<double>(longest)), 0.3, 0.75);
    bottom = std::min(0.42 * (y1 - y0), (0.85 * static_cast<double>(longest) * label_scale + 2.0) * cy);
  }
  size_t legend_entries = 0;
  size_t longest_label = 0;
  for (const auto& s : panel.series) {
    if (s.label.empty()) continue;
    ++legend_entries;
    longest_label = std::max(longest_label, s.label.size());
  }
  // Beside the panel, never over the data; a lone series needs no legend.
  const bool legend_outside = legend_entries > 1;
  const double right =
      legend_outside ? (0.55 * static_cast<double>(longest_label) * kLegendScale + 7.0) * cx : 1.5 * cx;
  const double top = ((panel.note.empty() ? 3.2 : 4.4) + (panel.log_y ? 1.0 : 0.0)) * cy;
  plvpor(x0 + 7.5 * cx, x1 - right, y0 + bottom, y1 - top);
  const Range xw = categorical ? Range{-0.6, static_cast<double>(panel.x_categories.size()) - 0.4} : xr.padded(0.02);
  Range yw = yr.padded(0.05);
  if (panel.log_y && !yr.empty()) yw = {std::floor(yr.low - 0.05), std::ceil(yr.high + 0.05)};
  if (has_bars && !panel.log_y) yw.low = std::min(yw.low, 0.0);
  plwind(xw.low, xw.high, yw.low, yw.high);

  plcol0(kGrey);
  plwidth(0.5);
  plbox(categorical ? "g" : "g", 0, 0, panel.log_y ? "gl" : "g", 0, 0);  // light grid
  plcol0(kBlack);
  plwidth(1.0);
  plslabelfunc(linear_tick_label, nullptr);
  plbox(categorical ? "bc" : "bcnsto", 0, 0, panel.log_y ? "bcnstlv" : "bcnstvo", 0, 0);
  plslabelfunc(nullptr, nullptr);

  std::vector<PLINT> colours;
  const size_t bar_count = static_cast<size_t>(std::count_if(
      panel.series.begin(), panel.series.end(), [](const Series& s) { return s.style == SeriesStyle::bars; }));
  size_t bar_index = 0;
  for (size_t k = 0; k < panel.series.size(); ++k) {
    const auto& s = panel.series[k];
    const PLINT colour = kFirstSeries + static_cast<PLINT>(k);
    colours.push_back(colour);
    plscol0(colour, s.colour.r, s.colour.g, s.colour.b);
    plcol0(colour);
    plwidth(2.0);
    pllsty(s.style == SeriesStyle::dashed_line ? 3 : 1);
    switch (s.style) {
      case SeriesStyle::line:
      case SeriesStyle::dashed_line:
        draw_runs(s.x, ys[k]);
        break;
      case SeriesStyle::points:
        draw_points(s.x, ys[k]);
        break;
      case SeriesStyle::line_and_points:
        draw_runs(s.x, ys[k]);
        draw_points(s.x, ys[k]);
        break;
      case SeriesStyle::bars:
        draw_bars(s.x, ys[k], bar_index++, bar_count, yw.low);
        break;
    }
    pllsty(1);
  }
  plwidth(1.0);
  plcol0(kBlack);
  if (categorical) {
    plschr(0.0, label_scale * scale);
    const double n = static_cast<double>(panel.x_categories.size());
    for (size_t i = 0; i < panel.x_categories.size(); ++i) {
      // Position along the bottom edge, as a fraction of the window [-0.6, n - 0.4].
      const double at = (static_cast<double>(i) + 0.6) / n;
      plmtex("bv", 0.5, at, 1.0, plplot_text(panel.x_categories[i]).c_str());
    }
    plschr(0.0, scale);
  }
  const double lift = panel.log_y ? 0.8 : 0.0;  // a log axis's top label has an exponent above it
  if (yr.empty()) plptex((xw.low + xw.high) / 2, (yw.low + yw.high) / 2, 1, 0, 0.5, "no data");
  plmtex("t", (panel.note.empty() ? 1.6 : 2.8) + lift, 0.5, 0.5, plplot_text(panel.title).c_str());
  if (!panel.note.empty()) {
    plschr(0.0, 0.75 * scale);
    plmtex("t", 1.2 + lift, 0.5, 0.5, plplot_text(panel.note).c_str());
    plschr(0.0, scale);
  }
  if (!categorical) plmtex("b", 2.6, 0.5, 0.5, plplot_text(panel.x_label).c_str());
  plmtex("l", 5.6, 0.5, 0.5, plplot_text(panel.y_label).c_str());
  draw_legend(panel, colours, legend_outside, scale);
  plschr(0.0, 1.0);
}

bool has_pngcairo() {
  // The caller provides the arrays; `count` goes in as their size and comes back as the number
  // of devices found.
  std::vector<const char*> menu_storage(256, nullptr), name_storage(256, nullptr);
  const char** menus = menu_storage.data();
  const char** names = name_storage.data();
  int count = static_cast<int>(name_storage.size());
  plgDevs(&menus, &names, &count);
  for (int i = 0; i < count; ++i) {
    if (names[i] != nullptr && std::string_view(names[i]) == "pngcairo") return true;
  }
  return false;
}

}  // namespace

Colour series_colour(size_t index) {
  static constexpr Colour kPalette[] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                                        {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127},
                                        {188, 189, 34},  {23, 190, 207}};
  return kPalette[index % std::size(kPalette)];
}

void write_png(const Figure& figure, const std::string& path) {
  GA_CHECK(figure.rows >= 1 && figure.columns >= 1 &&
               figure.panels.size() <= static_cast<size_t>(figure.rows * figure.columns),
           "{}: {} panels do not fit a {}x{} grid", path, figure.panels.size(), figure.rows, figure.columns);
  // PLplot ends the process on errors it cannot recover from (and asks on the terminal for a
  // device it does not know), so everything that can fail is checked first.
  GA_CHECK(has_pngcairo(), "{}: PLplot has no pngcairo driver (Debian: install plplot-driver-cairo)", path);
  base::write_file_atomically_with(path, [&](const std::string& temporary) {
    {
      std::ofstream probe(temporary, std::ios::binary | std::ios::trunc);
      GA_CHECK(probe.good(), "{}: cannot create {}: {}", path, temporary, std::strerror(errno));
    }
    // A stream of its own, left at the end: a caller's PLplot stream (if any) is untouched.
    PLINT previous = 0, stream = 0;
    plgstrm(&previous);
    plmkstrm(&stream);
    plsdev("pngcairo");
    plsfnam(temporary.c_str());
    plspage(0, 0, figure.width, figure.height, 0, 0);
    plscolbg(255, 255, 255);
    plscmap0n(16 + 64);
    plscol0(kBlack, 0, 0, 0);
    plscol0(kGrey, 225, 225, 225);
    plinit();
    pladv(0);
    PLFLT xmin_mm = 0, xmax_mm = 0, ymin_mm = 0, ymax_mm = 0;
    plgspa(&xmin_mm, &xmax_mm, &ymin_mm, &ymax_mm);
    const double top = figure.title.empty() ? 1.0 : 0.95;
    if (!figure.title.empty()) {
      plvpor(0.0, 1.0, 0.0, 1.0);
      plwind(0.0, 1.0, 0.0, 1.0);
      plcol0(kBlack);
      plschr(0.0, 1.2);
      plptex(0.5, 0.97, 1.0, 0.0, 0.5, plplot_text(figure.title).c_str());
      plschr(0.0, 1.0);
    }
    for (size_t i = 0; i < figure.panels.size(); ++i) {
      const double row = static_cast<double>(i / static_cast<size_t>(figure.columns));
      const double column = static_cast<double>(i % static_cast<size_t>(figure.columns));
      const double w = 1.0 / figure.columns, h = top / figure.rows;
      draw_panel(figure.panels[i], column * w, (column + 1) * w, top - (row + 1) * h, top - row * h, xmax_mm - xmin_mm,
                 ymax_mm - ymin_mm, figure.columns > 1 ? 0.8 : 1.0);
    }
    plend1();
    plsstrm(previous);
    std::error_code error;
    GA_CHECK(std::filesystem::file_size(temporary, error) > 0 && !error, "{}: PLplot wrote nothing", temporary);
  });
}

}  // namespace gradaccum::report
