#include "common/text_table.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "common/error.hpp"

namespace trainyard {

TextTable::TextTable(std::vector<std::string> header, std::vector<bool> right_aligned)
    : header_(std::move(header)), right_(std::move(right_aligned)) {
  right_.resize(header_.size(), false);
}

void TextTable::add_row(std::vector<std::string> cells) {
  TRAINYARD_CHECK(cells.size() == header_.size(), "table row has the wrong number of cells");
  rows_.push_back(std::move(cells));
}

std::size_t terminal_columns() {
  if (const char* columns = std::getenv("COLUMNS"); columns != nullptr && *columns != '\0') {
    char* end = nullptr;
    const long n = std::strtol(columns, &end, 10);
    if (*end == '\0' && n > 0) return static_cast<std::size_t>(n);
  }
  winsize size{};
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 0;
}

namespace {

constexpr std::size_t kGap = 2;            // spaces between columns
constexpr std::size_t kShortestText = 12;  // a shortened text column keeps at least this many characters (or its header)

// Narrows column `c` until the row fits `max_width`, down to its header or kShortestText (then the row wraps).
void fit(std::vector<std::size_t>& width, const std::vector<std::string>& header, std::size_t c, std::size_t max_width) {
  if (max_width == 0 || c >= width.size()) return;
  std::size_t total = kGap * (width.size() - 1);
  for (auto w : width) total += w;
  if (total <= max_width) return;
  const std::size_t least = std::min(width[c], std::max(header[c].size(), kShortestText));
  const std::size_t excess = total - max_width;
  width[c] = std::max(least, width[c] > excess ? width[c] - excess : 0);
}

// A cell cut to `width` with "..." when longer.
std::string cut(const std::string& cell, std::size_t width) { return cell.size() <= width ? cell : cell.substr(0, width - 3) + "..."; }

}  // namespace

void TextTable::print(std::ostream& out) const { print(out, &out == &std::cout ? terminal_columns() : 0); }

void TextTable::print(std::ostream& out, std::size_t max_width) const {
  std::vector<std::size_t> width(header_.size());
  for (std::size_t c = 0; c < header_.size(); ++c) {
    width[c] = header_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  fit(width, header_, shortened_, max_width);
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      const std::string cell = cut(cells[c], width[c]);
      const std::string pad(width[c] - cell.size(), ' ');
      if (c > 0) text += std::string(kGap, ' ');
      text += right_[c] ? pad + cell : cell + (c + 1 < cells.size() ? pad : "");
    }
    out << text << '\n';
  };
  line(header_);
  std::vector<std::string> rule;
  for (auto w : width) rule.emplace_back(w, '-');
  line(rule);
  for (const auto& row : rows_) line(row);
}

}  // namespace trainyard
