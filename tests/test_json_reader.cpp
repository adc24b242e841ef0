#include <gtest/gtest.h>

#include "common/error.hpp"
#include "common/json_reader.hpp"
#include "test_support.hpp"

namespace trainyard::json {

using trainyard::test::error_of;

namespace {
const Sources kSources = {{"ds", Source{Source::Kind::datasheet, "Some datasheet", "", "", "", ""}}};
}  // namespace

TEST(JsonReader, SyntaxErrorGivesLineAndColumn) {
  const std::string msg = error_of([] { parse("{\n  \"a\": 1,\n  \"b\": ]\n}", "bad.json"); });
  EXPECT_NE(msg.find("bad.json:3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
}

TEST(JsonReader, MissingFileIsAnInputError) {
  const std::string msg = error_of([] { parse_file("/nonexistent/trainyard/x.json"); });
  EXPECT_NE(msg.find("/nonexistent/trainyard/x.json"), std::string::npos) << msg;
}

TEST(JsonReader, UnknownFieldIsNamed) {
  const Json doc = {{"name", "x"}, {"hbm_gb", 80}};
  Reader r(doc, "f.json");
  EXPECT_EQ(r.string("name"), "x");
  const std::string msg = error_of([&] { r.finish(); });
  EXPECT_NE(msg.find("f.json: field 'hbm_gb'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown field"), std::string::npos) << msg;
}

TEST(JsonReader, MissingFieldIsNamedWithItsPath) {
  const Json doc = {{"outer", {{"a", 1}}}};
  Reader r(doc, "f.json");
  const Reader outer = r.object("outer");
  const std::string msg = error_of([&] { outer.integer("b", 0, 10); });
  EXPECT_NE(msg.find("field 'outer.b'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(JsonReader, NumbersOutsideTheirBoundSayWhatWasExpected) {
  const Json doc = {{"n", -3}, {"s", "7"}, {"f", 2.5}};
  Reader r(doc, "f.json");
  std::string msg = error_of([&] { r.integer("n", 1, 100); });
  EXPECT_NE(msg.find("expected an integer in [1, 100]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got -3"), std::string::npos) << msg;
  msg = error_of([&] { r.integer("s", 1, 100); });
  EXPECT_NE(msg.find("got \"7\""), std::string::npos) << msg;
  msg = error_of([&] { r.integer("f", 1, 100); });
  EXPECT_NE(msg.find("got 2.5"), std::string::npos) << msg;
}

TEST(JsonReader, BytesGivenInGigabytesGetAHint) {
  const Json doc = {{"hbm_bytes", {{"value", 80}, {"source", "ds"}}}};
  Reader r(doc, "gpu.json");
  const std::string msg = error_of([&] { r.figure("hbm_bytes", Bound{1073741824.0, 1e13, "bytes", true, true}, kSources); });
  EXPECT_NE(msg.find("field 'hbm_bytes.value'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("looks like GB"), std::string::npos) << msg;
}

TEST(JsonReader, FigureNeedsAKnownSource) {
  const Json doc = {{"x", {{"value", 5}, {"source", "nope"}}}, {"y", 5}};
  Reader r(doc, "f.json");
  std::string msg = error_of([&] { r.figure("x", Bound{0, 10, ""}, kSources); });
  EXPECT_NE(msg.find("field 'x.source'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(ds)"), std::string::npos) << msg;
  msg = error_of([&] { r.figure("y", Bound{0, 10, ""}, kSources); });
  EXPECT_NE(msg.find("a figure object"), std::string::npos) << msg;
}

TEST(JsonReader, GoodFigureKeepsItsSource) {
  const Json doc = {{"x", {{"value", 5}, {"source", "ds"}, {"note", "n"}}}};
  Reader r(doc, "f.json");
  const Figure f = r.figure("x", Bound{0, 10, ""}, kSources);
  r.finish();
  EXPECT_EQ(f.value, 5);
  EXPECT_EQ(f.source.kind, Source::Kind::datasheet);
  EXPECT_EQ(f.source.document, "Some datasheet");
  EXPECT_EQ(f.note, "n");
}

}  // namespace trainyard::json
