#pragma once
// Errors that travel up to main. InputError is the user's fault (exit 2) and always names where the bad
// input is: the file (or "--flag"), the field inside it, what was expected and what was found.
#include <stdexcept>
#include <string>

namespace trainyard {

class InputError : public std::runtime_error {
 public:
  // "<origin>: field '<field>': expected <expected>, got <got>"
  InputError(std::string origin, std::string field, std::string expected, std::string got);
  // A free-form message that already names its origin (e.g. a JSON syntax error with line:column).
  explicit InputError(std::string message);

  const std::string& origin() const { return origin_; }
  const std::string& field() const { return field_; }

 private:
  std::string origin_;
  std::string field_;
};

// A broken invariant inside trainyard itself (a bug, not bad input): carries file:line.
class InternalError : public std::logic_error {
 public:
  InternalError(const std::string& what, const char* file, int line);
};

#define TRAINYARD_CHECK(cond, what)                                            \
  do {                                                                         \
    if (!(cond)) throw ::trainyard::InternalError((what), __FILE__, __LINE__); \
  } while (0)

}  // namespace trainyard
