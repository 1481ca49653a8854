// Fuzz target: the safetensors reader must reject any malformed input with oomb::format_error,
// and read every tensor of any input it accepts, without crashing or undefined behaviour.
// SPDX-License-Identifier: Apache-2.0
#include <cmath>

#include "fuzz_target.hpp"
#include "trainer/io/safetensors.hpp"

using namespace oomb_trainer;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto f = safetensors_file::from_memory("fuzz.safetensors", data, size);
    for (const auto& t : f.tensors()) {
      (void)f.metadata().size();
      std::vector<unsigned char> raw(static_cast<std::size_t>(t.end - t.begin));
      f.read_raw(t.name, raw.data());
      const bool floating = t.type == dtype::f64 || t.type == dtype::f32 || t.type == dtype::bf16 || t.type == dtype::f16;
      if (!floating) continue;
      const auto vf = f.read<float>(t.name, t.shape);
      const auto vd = f.read<double>(t.name, t.shape);
      // Both conversions must agree (double -> float of the double equals the float read).
      for (std::size_t i = 0; i < vf.size(); ++i)
        if (!(std::isnan(vf[i]) && std::isnan(vd[i])) && vf[i] != static_cast<float>(vd[i])) __builtin_trap();
    }
  } catch (const oomb::format_error&) {
  }
  return 0;
}

std::vector<std::string> fuzz_seeds() {
  std::vector<std::string> seeds;
  const float f[6] = {1.5f, -2.0f, 0.0f, 3.25f, -0.125f, 1e-40f};
  const double d[3] = {1.0 / 3.0, -1e300, 2.5};
  {
    safetensors_writer w;
    w.add("model.embed_tokens.weight", {2, 3}, f, dtype::f32);
    w.add("b", {3}, d, dtype::f64);
    w.add("c", {3, 2}, f, dtype::bf16);
    w.add("s", {}, d, dtype::f32);
    w.add("z", {0, 4}, static_cast<const float*>(nullptr), dtype::f32);
    w.set_metadata("format", "pt");
    seeds.push_back(w.to_bytes());
  }
  {
    safetensors_writer w;
    w.add("w", {1}, f, dtype::f32);
    seeds.push_back(w.to_bytes());
  }
  // Hand-written: F16, an integer tensor, and a gap between tensors.
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"i":{"dtype":"I32","shape":[1],"data_offsets":[8,12]},"__metadata__":{"k":"v"}})";
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  s += header;
  s += std::string("\x00\x3c\x00\xc0\xff\xff\xff\xff\x07\x00\x00\x00", 12);
  seeds.push_back(s);
  return seeds;
}

std::vector<std::string> fuzz_dictionary() {
  return {"\"F32\"", "\"BF16\"", "\"F16\"", "\"F64\"", "\"I64\"", "\"BOOL\"", "\"F8_E4M3\"", "\"dtype\"",
          "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "[]", "{}", "[0,0]", "-1", "18446744073709551615",
          "9223372036854775808", "4294967296", "1e400", "0.5", "null", "true", "\"\\u0000\"", ","};
}
