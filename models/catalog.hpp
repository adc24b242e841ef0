#pragma once
// The built-in model catalog (models/*.json, compiled in), user files by path, and custom:... specs.
#include <string>
#include <vector>

#include "models/model.hpp"

namespace trainyard::model {

std::vector<std::string> builtin_model_names();
bool is_builtin_model(std::string_view name);
// A built-in name, a path to a .json file, or "custom:layers=..,hidden=..,heads=..[,...]".
ModelConfig load_model(std::string_view reference, const std::string& origin = "--model", std::vector<std::string>* defaults_used = nullptr);

}  // namespace trainyard::model
