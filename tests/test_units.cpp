#include <gtest/gtest.h>

#include "common/error.hpp"
#include "common/text_table.hpp"
#include "common/units.hpp"

namespace trainyard {

TEST(Units, TokenCountsUseBinarySuffixes) {
  EXPECT_EQ(parse_token_count("4096", "--seq"), 4096);
  EXPECT_EQ(parse_token_count("32K", "--seq"), 32768);
  EXPECT_EQ(parse_token_count("1M", "--seq"), 1048576);
  EXPECT_EQ(parse_token_count("1.5M", "--seq"), 1572864);
  EXPECT_EQ(parse_token_count("2G", "--seq"), 2147483648LL);
}

TEST(Units, BadTokenCountsNameTheFlag) {
  for (const char* bad : {"", "abc", "-5", "0", "12X", "1.5", "K"}) {
    try {
      parse_token_count(bad, "--seq");
      FAIL() << "accepted \"" << bad << "\"";
    } catch (const InputError& e) {
      EXPECT_EQ(e.origin(), "--seq");
      EXPECT_NE(std::string(e.what()).find("token count"), std::string::npos) << e.what();
    }
  }
}

TEST(Units, Formatting) {
  EXPECT_EQ(format_bytes(85899345920.0), "80.0 GiB");
  EXPECT_EQ(format_bytes(2199023255552.0), "2.00 TiB");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_count(8.03e9), "8.03 B");
  EXPECT_EQ(format_count(525.3e6), "525.3 M");
  EXPECT_EQ(format_tokens(1048576), "1M");
  EXPECT_EQ(format_tokens(65536), "64K");
  EXPECT_EQ(format_tokens(5000), "5000");
  EXPECT_EQ(format_flops(48.2e9), "48.2 GFLOP");
  // Seconds as the plan table shows them: three figures at most, in a unit that keeps small times readable.
  EXPECT_EQ(format_seconds(680.4), "680 s");
  EXPECT_EQ(format_seconds(20.63), "20.6 s");
  EXPECT_EQ(format_seconds(1.254), "1.25 s");
  EXPECT_EQ(format_seconds(0.4132), "413 ms");
  EXPECT_EQ(format_seconds(0.00212), "2.12 ms");
  EXPECT_EQ(format_seconds(87.5e-6), "87.5 us");
}

// A column that may be cut narrows to fit the width, its long cells ending in "..."; the other columns, the header
// and the table without a width stay whole (issue 45: `list`'s descriptions on an 80-column terminal).
TEST(TextTable, TheShortenedColumnFitsTheWidthAndTheOthersStayWhole) {
  TextTable t({"name", "GiB", "description"}, {false, true, false});
  t.add_row({"h100-sxm-80gb", "80", "NVIDIA H100 SXM5 80GB: datasheet figures, NVLink 4 at 450 GB/s per direction"});
  t.add_row({"a100", "40", "short"});
  t.shorten_to_terminal(2);
  std::ostringstream fitted, whole;
  t.print(fitted, 40);
  t.print(whole, 0);
  std::istringstream lines(fitted.str());
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 40U) << line;
  EXPECT_NE(fitted.str().find("h100-sxm-80gb"), std::string::npos);
  EXPECT_NE(fitted.str().find("...\n"), std::string::npos) << fitted.str();
  EXPECT_NE(fitted.str().find("short"), std::string::npos);
  EXPECT_NE(whole.str().find("450 GB/s per direction"), std::string::npos);
  // Too narrow even with the column at its least: the column keeps 12 characters (or its header) and the row wraps.
  std::ostringstream narrow;
  t.print(narrow, 10);
  EXPECT_NE(narrow.str().find("NVIDIA H1..."), std::string::npos) << narrow.str();
}

}  // namespace trainyard
