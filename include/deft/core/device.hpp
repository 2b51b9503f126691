// Where a tensor lives. Expressions check that all operands agree.
#pragma once
#include <algorithm>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace deft {

/// The kinds of device (gpu needs the CUDA backend, deft::cuda; docs/gpu.md).
enum class DeviceType : std::uint8_t { cpu, gpu };

/// Where a tensor lives: the CPU, or a numbered GPU.
struct Device {
  DeviceType type = DeviceType::cpu;  ///< cpu or gpu
  int index = 0;                      ///< which device of that type, from 0

  friend constexpr bool operator==(const Device&, const Device&) = default;

  /// "cpu(0)", "gpu(1)": the form error messages use.
  std::string to_string() const {
    return std::string(type == DeviceType::cpu ? "cpu(" : "gpu(") + std::to_string(index) + ")";
  }
  friend std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.to_string(); }
};

/// The CPU (index 0; the workers share it).
inline constexpr Device cpu(int index = 0) { return {DeviceType::cpu, index}; }
/// GPU number `index`; recording work on it throws until the CUDA backend exists.
inline constexpr Device gpu(int index = 0) { return {DeviceType::gpu, index}; }

namespace detail {
/// "cpu(0), cpu(1)": a list of devices as error messages write it.
inline std::string device_list(const std::vector<Device>& devices) {
  std::string s;
  for (const Device& d : devices) s += (s.empty() ? "" : ", ") + d.to_string();
  return s;
}

/// Whether all `devices` are of one kind. Devices of one kind compute a value
/// alike to the bit; the CPU and a GPU need not (summing order, fused
/// multiply-adds), so a value kept on a mix is computed once and copied.
inline bool one_device_kind(const std::vector<Device>& devices) {
  return std::ranges::all_of(devices, [&](Device d) { return d.type == devices.front().type; });
}
}  // namespace detail

}  // namespace deft
