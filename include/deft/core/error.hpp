// One way to raise errors: every message starts with "deft: " and names what was wrong.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace deft::detail {

template <class... Parts>
std::string message(const Parts&... parts) {
  std::ostringstream os;
  os << "deft: ";
  (os << ... << parts);
  return os.str();
}

template <class Exception = std::invalid_argument, class... Parts>
[[noreturn]] void raise(const Parts&... parts) {
  throw Exception(message(parts...));
}

}  // namespace deft::detail
