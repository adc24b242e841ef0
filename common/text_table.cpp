#include "common/text_table.hpp"

#include <algorithm>

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

void TextTable::print(std::ostream& out) const {
  std::vector<std::size_t> width(header_.size());
  for (std::size_t c = 0; c < header_.size(); ++c) {
    width[c] = header_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      const std::string pad(width[c] - cells[c].size(), ' ');
      if (c > 0) text += "  ";
      text += right_[c] ? pad + cells[c] : cells[c] + (c + 1 < cells.size() ? pad : "");
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
