// The element types a tensor may hold and their names.
#pragma once
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace deft {

/// The element types, as values (Tensor::dtype()).
enum class DType : std::uint8_t { float32, float64, int32, int64 };

/// Element types deft tensors support.
template <class T>
concept Element = std::same_as<T, float> || std::same_as<T, double> ||
                  std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t>;

/// The DType of element type T.
template <Element T>
inline constexpr DType dtype_of = std::is_same_v<T, float>          ? DType::float32
                                  : std::is_same_v<T, double>       ? DType::float64
                                  : std::is_same_v<T, std::int32_t> ? DType::int32
                                                                    : DType::int64;

/// Calls f(std::type_identity<T>{}) with the element type T that `t` names:
/// code that holds a DType at run time reaches its typed form this way.
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::float32: return f(std::type_identity<float>{});
    case DType::float64: return f(std::type_identity<double>{});
    case DType::int32: return f(std::type_identity<std::int32_t>{});
    case DType::int64: break;
  }
  return f(std::type_identity<std::int64_t>{});
}

/// "float32", "float64", "int32" or "int64".
inline constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
  }
  return "unknown";
}

/// The bytes of one element of type t.
inline constexpr std::size_t dtype_size(DType t) {
  return t == DType::float32 || t == DType::int32 ? 4 : 8;
}

/// The name of element type T's DType.
template <Element T>
inline constexpr const char* dtype_name_of = dtype_name(dtype_of<T>);

}  // namespace deft
