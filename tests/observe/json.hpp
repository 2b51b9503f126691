// A small JSON reader for the profiler tests: enough of RFC 8259 to read back
// what engine::trace_stop writes (objects, arrays, strings with escapes,
// numbers, true/false/null). Throws std::runtime_error at the first error.
#pragma once
#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace json {

struct Value;
using Object = std::map<std::string, Value>;
using Array = std::vector<Value>;

struct Value {
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<Array>, std::shared_ptr<Object>> v;
  const Object& obj() const { return *std::get<std::shared_ptr<Object>>(v); }
  const Array& arr() const { return *std::get<std::shared_ptr<Array>>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  double num() const { return std::get<double>(v); }
  bool has(const std::string& k) const { return obj().count(k) > 0; }
  const Value& operator[](const std::string& k) const {
    auto it = obj().find(k);
    if (it == obj().end()) throw std::runtime_error("json: no key '" + k + "'");
    return it->second;
  }
};

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}
  Value parse() {
    Value v = value();
    ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw std::runtime_error(std::string("json: ") + what + " at offset " + std::to_string(i_));
  }
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char c) {
    ws();
    if (i_ >= s_.size() || s_[i_] != c) fail("unexpected character");
    ++i_;
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (s_.compare(i_, w.size(), w) != 0) return false;
    i_ += w.size();
    return true;
  }
  Value value() {
    ws();
    if (i_ >= s_.size()) fail("unexpected end");
    const char c = s_[i_];
    if (c == '{') return Value{object()};
    if (c == '[') return Value{array()};
    if (c == '"') return Value{string()};
    if (literal("true")) return Value{true};
    if (literal("false")) return Value{false};
    if (literal("null")) return Value{nullptr};
    const char* begin = s_.c_str() + i_;
    char* end = nullptr;
    const double d = std::strtod(begin, &end);
    if (end == begin) fail("bad value");
    i_ += std::size_t(end - begin);
    return Value{d};
  }
  std::shared_ptr<Object> object() {
    auto o = std::make_shared<Object>();
    expect('{');
    ws();
    if (s_[i_] == '}') return ++i_, o;
    for (;;) {
      ws();
      std::string k = string();
      expect(':');
      (*o)[k] = value();
      ws();
      if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
      expect('}');
      return o;
    }
  }
  std::shared_ptr<Array> array() {
    auto a = std::make_shared<Array>();
    expect('[');
    ws();
    if (s_[i_] == ']') return ++i_, a;
    for (;;) {
      a->push_back(value());
      ws();
      if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
      expect(']');
      return a;
    }
  }
  std::string string() {
    if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string");
    ++i_;
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') { out += c; continue; }
      if (i_ >= s_.size()) fail("unexpected end");
      c = s_[i_++];
      switch (c) {
        case '"': case '\\': case '/': out += c; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          const long cp = std::strtol(s_.substr(i_, 4).c_str(), nullptr, 16);
          i_ += 4;
          if (cp >= 0x80) fail("non-ASCII \\u escape (not written by deft)");
          out += char(cp);
          break;
        }
        default: fail("bad escape");
      }
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }

  const std::string& s_;
  std::size_t i_ = 0;
};

inline Value parse(const std::string& text) { return Parser(text).parse(); }

}  // namespace json
