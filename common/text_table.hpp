#pragma once
// A table for people: columns padded to their widest cell, numbers right-aligned by the caller's choice. A column
// that may be cut (shorten_to_terminal: `list`'s descriptions) narrows on a terminal narrower than the table
// (terminal_columns), its long cells cut with "...", so that a row does not wrap; names, numbers and headers are
// never cut. Not done: wrapping cells over lines, which the plan tables' parameters would need.
#include <ostream>
#include <string>
#include <vector>

namespace trainyard {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header, std::vector<bool> right_aligned = {});
  void add_row(std::vector<std::string> cells);
  std::size_t columns() const { return header_.size(); }
  void shorten_to_terminal(std::size_t column) { shortened_ = column; }
  // Fitted to terminal_columns() when shortened and `out` is std::cout; `max_width` 0: as wide as the cells.
  void print(std::ostream& out) const;
  void print(std::ostream& out, std::size_t max_width) const;

 private:
  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
  std::size_t shortened_ = static_cast<std::size_t>(-1);  // the column that may be cut; none by default
};

// The width tables fit: COLUMNS when set to a number, else standard output's terminal width; 0 (no limit) when
// standard output is not a terminal and COLUMNS is unset (pipes and files get every cell whole).
std::size_t terminal_columns();

}  // namespace trainyard
