#include <deque>

#include "common/error.hpp"
#include "planner/schemes/scheme.hpp"

namespace trainyard::planner {

// The built-in entries, one file each in this folder.
Scheme ringtrack_scheme();
Scheme fpdt_scheme();
Scheme ulysses_scheme();
Scheme ring_attention_scheme();
Scheme megatron_scheme();
Scheme zero_scheme();

namespace {

struct Registry {
  std::deque<Scheme> entries;  // a deque: registering one more keeps the others' addresses
  std::vector<std::string> names;
  void add(Scheme s) {
    names.push_back(s.name);
    entries.push_back(std::move(s));
  }
};

Registry& registry() {
  static Registry r = [] {
    Registry built;
    for (Scheme (*entry)() : {ringtrack_scheme, fpdt_scheme, ulysses_scheme, ring_attention_scheme, megatron_scheme, zero_scheme}) {
      built.add(entry());
    }
    return built;
  }();
  return r;
}

}  // namespace

const std::vector<std::string>& scheme_names() { return registry().names; }

std::string scheme_list(std::string_view separator) {
  std::string out;
  for (const auto& name : scheme_names()) out += (out.empty() ? "" : std::string(separator)) + name;
  return out;
}

const Scheme* find_scheme(std::string_view name) {
  for (const Scheme& s : registry().entries) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const Scheme& scheme_named(std::string_view name, const std::string& origin, const std::string& field) {
  if (const Scheme* s = find_scheme(name)) return *s;
  throw InputError(origin, field, "one of " + scheme_list(), "\"" + std::string(name) + "\"");
}

void register_scheme(const Scheme& scheme) {
  if (find_scheme(scheme.name) != nullptr) throw InputError("scheme", "name", "a name no scheme has yet", "\"" + scheme.name + "\"");
  registry().add(scheme);
}

}  // namespace trainyard::planner
