#include <gtest/gtest.h>

#include "common/error.hpp"
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

}  // namespace trainyard
