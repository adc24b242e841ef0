#include "common/error.hpp"

namespace trainyard {

InputError::InputError(std::string origin, std::string field, std::string expected, std::string got)
    : std::runtime_error(origin + ": field '" + field + "': expected " + expected + ", got " + got),
      origin_(std::move(origin)),
      field_(std::move(field)) {}

InputError::InputError(std::string message) : std::runtime_error(std::move(message)) {}

InternalError::InternalError(const std::string& what, const char* file, int line)
    : std::logic_error(std::string(file) + ":" + std::to_string(line) + ": internal error: " + what) {}

}  // namespace trainyard
