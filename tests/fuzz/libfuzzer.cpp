// libFuzzer entry point: the input bytes drive the same generator as deft_fuzz
// (fz::ByteSource), so coverage guidance explores programs; a mismatch prints
// the shrunk reproducer and aborts, which libFuzzer records as a crash.
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "deft_runner.hpp"
#include "generator.hpp"
#include "shrink.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fz::ByteSource src(data, size);
  const fz::Program p = fz::Generator(src).program(0);
  static fz::Counters c;
  const fz::Result r = fz::run_program(p, c);
  if (r.status == fz::Result::mismatch) {
    std::cerr << "deft_libfuzzer: MISMATCH: " << r.message << "\nshrinking...\n";
    fz::Counters scratch;
    const fz::Program small =
        fz::shrink(p, [&](const fz::Program& q) { return fz::run_program(q, scratch).status == fz::Result::mismatch; });
    std::ostringstream code;
    fz::run_program(small, scratch, &code);
    std::cerr << code.str() << std::endl;
    std::abort();
  }
  if (r.status == fz::Result::invalid) {
    std::cerr << "deft_libfuzzer: the generator made an invalid program: " << r.message << "\n";
    std::abort();
  }
  return 0;
}
