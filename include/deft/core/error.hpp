// One way to raise errors: every message starts with "deft: " and names what was wrong.
#pragma once
#include <initializer_list>
#include <iosfwd>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace deft::detail {

/// One part of an error message: what to print and how. The parts of every
/// message go to one function (message_of), so that the many distinct
/// messages of a program compile one string stream, not one each.
struct MessagePart {
  const void* value;
  void (*print)(std::ostream&, const void*);
};

template <class T>
void print_part(std::ostream& os, const void* value) {
  os << *static_cast<const T*>(value);
}
inline void print_text(std::ostream& os, const void* value) { os << static_cast<const char*>(value); }

template <class T>
MessagePart message_part(const T& x) {
  if constexpr (std::is_array_v<T>) return {x, &print_text};  // a string literal of any length
  else return {&x, &print_part<T>};
}

// Cold and never inlined: every checked operation may raise, and inlining
// a string stream into each caller cost every translation unit optimizer
// time for paths that run only on bad input.
[[gnu::cold, gnu::noinline]] inline std::string message_of(std::initializer_list<MessagePart> parts) {
  std::ostringstream os;
  os << "deft: ";
  for (const MessagePart& p : parts) p.print(os, p.value);
  return os.str();
}

template <class Exception>
[[noreturn, gnu::cold, gnu::noinline]] void raise_parts(std::initializer_list<MessagePart> parts) {
  throw Exception(message_of(parts));
}

/// "deft: " followed by the parts, as an ostream prints them.
template <class... Parts>
std::string message(const Parts&... parts) {
  return message_of({message_part(parts)...});
}

/// Throws an Exception whose what() is message(parts...).
template <class Exception = std::invalid_argument, class... Parts>
[[noreturn]] inline void raise(const Parts&... parts) {
  raise_parts<Exception>({message_part(parts)...});
}

}  // namespace deft::detail
