#pragma once
// A table for people: columns padded to their widest cell, numbers right-aligned by the caller's choice.
#include <ostream>
#include <string>
#include <vector>

namespace trainyard {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header, std::vector<bool> right_aligned = {});
  void add_row(std::vector<std::string> cells);
  void print(std::ostream& out) const;

 private:
  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace trainyard
