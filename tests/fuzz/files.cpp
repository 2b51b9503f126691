// libFuzzer over deft's file readers: gunzip, IDX files (plain or gzipped)
// and parameter files. Every input must load or raise std::runtime_error or
// std::invalid_argument saying what is wrong; any other exception, a crash,
// a hang or a sanitizer report is a bug. The first byte picks the reader,
// the rest is the file. files_seeds/ holds one valid file per reader.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <typeinfo>

#include <unistd.h>

#include <deft/data.hpp>
#include <deft/nn.hpp>

namespace {

const std::filesystem::path& scratch_file() {
  static const auto p = std::filesystem::temp_directory_path() / ("deft_fuzz_files_" + std::to_string(::getpid()));
  return p;
}

void write(const std::filesystem::path& p, std::span<const std::uint8_t> bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// The network parameter files are loaded into: Dense(3, relu), Dense(2) on
// inputs of 4 features, its shapes known after one forward.
deft::nn::Sequential& network() {
  static const auto net = [] {
    auto n = std::make_shared<deft::nn::Sequential>();
    n->add(std::make_shared<deft::nn::Dense>(3, deft::nn::Act::relu), std::make_shared<deft::nn::Dense>(2));
    n->initialize();
    (void)(*n)(deft::ones<float>({1, 4})).to_vector();
    return n;
  }();
  return *net;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::span<const std::uint8_t> file(data + 1, size - 1);
  try {
    switch (data[0] % 3) {
      case 0:
        (void)deft::data::gunzip(file, "fuzz.gz", std::size_t(1) << 24);
        break;
      case 1:
        write(scratch_file(), file);
        (void)deft::data::read_idx(scratch_file());
        break;
      default:
        write(scratch_file(), file);
        deft::nn::load_parameters(network(), scratch_file());
        break;
    }
  } catch (const std::runtime_error&) {  // what bad files must give
  } catch (const std::invalid_argument&) {
  } catch (const std::exception& e) {
    std::cerr << "deft_fuzz_files: reader " << int(data[0] % 3) << " threw " << typeid(e).name() << ": " << e.what()
              << "\n";
    std::abort();
  }
  return 0;
}
