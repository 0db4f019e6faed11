// Line and bar charts written as PNG files, drawn by PLplot (Debian's libplplot-dev with its
// cairo driver, pngcairo). PLplot is a C library that needs no display, no GUI toolkit at run
// time and no Python: a plot is a few calls and a file appears; its cairo driver draws
// antialiased lines and text. (Gnuplot would need a child process and a data pipe per figure;
// matplotlib-cpp needs Python; MathGL is not packaged with a PNG driver in Debian 12.)
//
// A Figure is a grid of panels; each panel has series of (x, y) points drawn as lines, points or
// bars over a numeric or a categorical x axis. Points whose y is not finite (or not positive on
// a log axis) are left out and break the line there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradaccum::report {

struct Colour {
  uint8_t r = 0, g = 0, b = 0;
};

// Ten distinguishable colours (the "tab10" palette's values), for series in order.
Colour series_colour(size_t index);

enum class SeriesStyle { line, dashed_line, points, line_and_points, bars };

struct Series {
  std::string label;  // listed in the legend right of the panel (when two or more are labelled)
  std::vector<double> x, y;
  Colour colour;
  SeriesStyle style = SeriesStyle::line;
};

struct Panel {
  std::string title, x_label, y_label;
  bool log_y = false;
  // Categorical x axis: series' x are indices 0..n-1 and these names are written under the
  // axis, perpendicular to it (a model's parameter names). Empty: a numeric axis.
  std::vector<std::string> x_categories;
  std::vector<Series> series;
  std::string note;  // one line under the title (e.g. a largest relative difference)
};

struct Figure {
  int width = 1200, height = 800;  // pixels
  int rows = 1, columns = 1;       // panels fill the grid row by row; text is smaller beyond one column
  std::string title;               // above every panel; empty: none
  std::vector<Panel> panels;
};

// Draws `figure` into the PNG file `path`, written to a temporary file beside it and renamed, so
// that a failure leaves no partial file. Throws gradaccum::Error naming `path` when it cannot be
// written.
void write_png(const Figure& figure, const std::string& path);

}  // namespace gradaccum::report
