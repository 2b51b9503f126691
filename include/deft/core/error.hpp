// One way to raise errors: every message starts with "deft: " and names what was wrong.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace deft::detail {

// Both are cold and never inlined: every checked operation calls raise,
// and inlining its string stream into each caller cost every translation
// unit optimizer time for paths that run only on bad input.
template <class... Parts>
[[gnu::cold, gnu::noinline]] std::string message(const Parts&... parts) {
  std::ostringstream os;
  os << "deft: ";
  (os << ... << parts);
  return os.str();
}

template <class Exception = std::invalid_argument, class... Parts>
[[noreturn, gnu::cold, gnu::noinline]] void raise(const Parts&... parts) {
  throw Exception(message(parts...));
}

}  // namespace deft::detail
