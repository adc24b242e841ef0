#pragma once
// Name-or-path resolution shared by the hardware and model catalogs: "h100-sxm" finds the built-in file
// hwprofiles/gpus/h100-sxm.json compiled into the binary; anything that looks like a path is read from disk.
#include <string>
#include <string_view>
#include <vector>

#include "common/embedded.hpp"
#include "common/json_reader.hpp"

namespace trainyard {

struct LoadedDocument {
  json::Json json;
  std::string origin;  // the path, or "hwprofiles/gpus/h100-sxm.json (built-in)"
};

// A path contains a '/' or ends in ".json"; everything else is a built-in name.
bool looks_like_path(std::string_view text);

class Catalog {
 public:
  // `dir` selects the built-ins of this catalog (e.g. "hwprofiles/gpus/"); `what` names them in errors.
  Catalog(const std::vector<EmbeddedFile>& builtins, std::string dir, std::string what);

  std::vector<std::string> names() const;  // sorted
  bool contains(std::string_view name) const;
  // Loads a built-in by name, or a file by path. `origin` names where the reference came from (a flag such
  // as "--hw", or "<file>: field 'gpu'") for the error when the name is unknown.
  LoadedDocument load(std::string_view name_or_path, const std::string& origin) const;

 private:
  const std::vector<EmbeddedFile>* builtins_;
  std::string dir_;
  std::string what_;
};

}  // namespace trainyard
