#include <deque>

#include "common/error.hpp"
#include "common/units.hpp"
#include "planner/schemes/scheme.hpp"

namespace trainyard::planner {

// The built-in entries, one folder each beside this file (NAME/NAME_scheme.cpp).
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

std::vector<std::string> schemes_from_list(const std::string& text) {
  if (text == "all") return scheme_names();
  std::vector<std::string> out;
  for (const auto& item : split_commas(text)) {
    if (find_scheme(item) == nullptr) {
      throw InputError("--strategies", "value", "all, or a comma list of " + scheme_list(),
                       "\"" + item + "\"" + (item == "hotspa" ? " (HotSPa switches between these schemes: plan --lengths)" : ""));
    }
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
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

Recompute recompute_flag(const FlagValues& flags) {
  const std::string r = flags.text("recompute").value_or("none");
  for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full}) {
    if (to_string(mode) == r) return mode;
  }
  throw InputError("--recompute", "value", "none, selective or full", "\"" + r + "\"");
}

nlohmann::json params_json(const Scheme& scheme, const PlanSpec& spec) {
  nlohmann::json out = nlohmann::json::object();
  for (const Param& p : scheme.params) out[p.key] = p.get(spec);
  return out;
}

namespace {

// A set parameter's comma list ("none": empty), each item checked against its choices.
void read_set(const Param& p, const json::Reader& r, PlanSpec& spec) {
  const std::string list = r.string(p.key);
  if (list != "none") {
    for (const auto& item : split_commas(list)) {
      if (std::find(p.choices.begin(), p.choices.end(), item) == p.choices.end()) {
        std::string allowed;
        for (const auto& c : p.choices) allowed += (allowed.empty() ? "" : ", ") + c;
        r.fail(p.key, "\"none\" or a comma list of " + allowed, "\"" + list + "\"");
      }
    }
  }
  p.set(spec, list);
}

}  // namespace

void read_params(const Scheme& scheme, const json::Reader& r, PlanSpec& spec) {
  for (const Param& p : scheme.params) {
    if (p.optional && !r.has(p.key)) continue;
    switch (p.kind) {
      case Param::Kind::integer:
      case Param::Kind::tokens: p.set(spec, r.integer(p.key, p.min, p.max)); break;
      case Param::Kind::boolean: p.set(spec, r.boolean(p.key)); break;
      case Param::Kind::choice: p.set(spec, r.choice(p.key, p.choices)); break;
      case Param::Kind::set: read_set(p, r, spec); break;
      case Param::Kind::custom: p.read(r, spec); break;
    }
  }
}

const HotSpaFacet& hotspa_facet(const PlanSpec& spec) {
  const Scheme& s = scheme_named(spec.scheme);
  TRAINYARD_CHECK(s.hotspa.has_value(), "scheme " + s.name + " has no HotSPa facet");
  return *s.hotspa;
}

void register_scheme(const Scheme& scheme) {
  if (find_scheme(scheme.name) != nullptr) throw InputError("scheme", "name", "a name no scheme has yet", "\"" + scheme.name + "\"");
  registry().add(scheme);
}

}  // namespace trainyard::planner
