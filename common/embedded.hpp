#pragma once
// A data file compiled into the binary (see cmake/EmbedJson.cmake).
#include <string_view>
#include <vector>

namespace trainyard {

struct EmbeddedFile {
  std::string_view path;  // relative to the source root, e.g. "hwprofiles/gpus/h100-sxm.json"
  std::string_view text;
};

}  // namespace trainyard
