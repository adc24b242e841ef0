#include "common/catalog.hpp"

#include <algorithm>

#include "common/error.hpp"

namespace trainyard {

bool looks_like_path(std::string_view text) { return text.find('/') != std::string_view::npos || text.ends_with(".json"); }

Catalog::Catalog(const std::vector<EmbeddedFile>& builtins, std::string dir, std::string what)
    : builtins_(&builtins), dir_(std::move(dir)), what_(std::move(what)) {}

namespace {
// "hwprofiles/gpus/h100-sxm.json" under "hwprofiles/gpus/" -> "h100-sxm"
std::string_view name_of(const EmbeddedFile& file, std::string_view dir) {
  std::string_view path = file.path;
  if (!path.starts_with(dir) || !path.ends_with(".json")) return {};
  path.remove_prefix(dir.size());
  path.remove_suffix(5);
  return path.find('/') == std::string_view::npos ? path : std::string_view{};
}
}  // namespace

std::vector<std::string> Catalog::names() const {
  std::vector<std::string> out;
  for (const auto& file : *builtins_) {
    if (auto name = name_of(file, dir_); !name.empty()) out.emplace_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool Catalog::contains(std::string_view name) const {
  return std::any_of(builtins_->begin(), builtins_->end(), [&](const EmbeddedFile& f) { return name_of(f, dir_) == name; });
}

LoadedDocument Catalog::load(std::string_view name_or_path, const std::string& origin) const {
  if (looks_like_path(name_or_path)) {
    const std::string path(name_or_path);
    return {json::parse_file(path), path};
  }
  for (const auto& file : *builtins_) {
    if (name_of(file, dir_) == name_or_path) {
      std::string where = std::string(file.path) + " (built-in)";
      return {json::parse(file.text, where), where};
    }
  }
  std::string known;
  for (const auto& name : names()) known += (known.empty() ? "" : ", ") + name;
  throw InputError(origin + ": unknown " + what_ + " \"" + std::string(name_or_path) + "\": expected one of " + known +
                   ", or a path to a .json file");
}

}  // namespace trainyard
