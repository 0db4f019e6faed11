// The pixels of a PNG file, for the tests of figures and screenshots (libpng's simplified API).
#pragma once

#include <png.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradaccum::testing {

struct PngPixels {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // row by row, 3 bytes per pixel

  uint32_t at(int x, int y) const {
    const size_t i = (static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) * 3;
    return (uint32_t{rgb[i]} << 16) | (uint32_t{rgb[i + 1]} << 8) | rgb[i + 2];
  }
  size_t distinct_colours() const {
    std::set<uint32_t> seen;
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) seen.insert(at(x, y));
    }
    return seen.size();
  }
  // The fraction of pixels that differ from the top-left pixel (the background).
  double foreground_fraction() const {
    const uint32_t background = at(0, 0);
    size_t count = 0;
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) count += at(x, y) != background;
    }
    return static_cast<double>(count) / (static_cast<double>(width) * height);
  }
  // The pixels within `tolerance` of colour (r, g, b) in every channel.
  size_t count_colour(int r, int g, int b, int tolerance) const {
    size_t count = 0;
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) {
        const uint32_t c = at(x, y);
        count += std::abs(static_cast<int>(c >> 16) - r) <= tolerance &&
                 std::abs(static_cast<int>((c >> 8) & 255) - g) <= tolerance &&
                 std::abs(static_cast<int>(c & 255) - b) <= tolerance;
      }
    }
    return count;
  }
  // The longest run of dark grey-to-black pixels (every channel below `level`, nearly equal) in
  // row `y`: a plot's frame, drawn with antialiasing, is such a run.
  int longest_dark_run(int y, int level = 200) const {
    int best = 0, run = 0;
    for (int x = 0; x < width; ++x) {
      const uint32_t c = at(x, y);
      const int r = static_cast<int>(c >> 16), g = static_cast<int>((c >> 8) & 255), b = static_cast<int>(c & 255);
      if (std::max({r, g, b}) < level && std::abs(r - g) < 20 && std::abs(g - b) < 20) {
        best = std::max(best, ++run);
      } else {
        run = 0;
      }
    }
    return best;
  }
};

inline PngPixels read_png(const std::string& path) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str())) {
    throw std::runtime_error(path + ": " + image.message);
  }
  image.format = PNG_FORMAT_RGB;
  PngPixels pixels;
  pixels.width = static_cast<int>(image.width);
  pixels.height = static_cast<int>(image.height);
  pixels.rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, pixels.rgb.data(), 0, nullptr)) {
    png_image_free(&image);
    throw std::runtime_error(path + ": " + image.message);
  }
  return pixels;
}

}  // namespace gradaccum::testing
