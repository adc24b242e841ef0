// The cuBLASLt wrapper against the CPU reference: the layer's three GEMM forms (no transpose, B transposed, A
// transposed), bf16 and fp32 outputs, alpha/beta, sizes that are not multiples of 16. Outputs are poisoned first.
// Tolerance: fp32 accumulation over k bf16 products is within about k * 2^-24 relative of the fp64 reference;
// a bf16 output adds one rounding (2^-9 relative), allowed as 2^-7 of the largest |C|.
#include <algorithm>

#include "kernels/gemm.hpp"
#include "tests/gpu_support.hpp"

namespace trainyard::kernels {

using test::DeviceBuffer;

TEST(GpuGemm, RowMajorProductsWithTransposesMatchTheReference) {
  TRAINYARD_REQUIRE_GPU();
  Gemm gemm;
  struct Case {
    int m, n, k;
    bool ta, tb;
  };
  for (const Case c :
       {Case{64, 96, 128, false, false}, Case{37, 53, 77, false, true}, Case{128, 40, 200, true, false}, Case{1, 4096, 4096, false, true}}) {
    const auto a = test::random_bf16_values(static_cast<std::size_t>(c.m * c.k), 1),
               b = test::random_bf16_values(static_cast<std::size_t>(c.k * c.n), 2);
    const auto c0 = test::random_bf16_values(static_cast<std::size_t>(c.m * c.n), 3);
    std::vector<float> ref = c0;
    gemm_ref(c.m, c.n, c.k, a, c.ta, b, c.tb, ref, 0.5f, 2.0f);
    double top = 0;
    for (float x : ref) top = std::max(top, static_cast<double>(std::abs(x)));
    DeviceBuffer<bf16_bits> da(test::bits(a)), db(test::bits(b));
    DeviceBuffer<float> out32(c0);
    gemm.run(c.m, c.n, c.k, da.get(), c.ta, db.get(), c.tb, out32.get(), true, 0.5f, 2.0f, nullptr);
    EXPECT_TRUE(test::close_to(out32.download(), ref, 1e-4 * top, 0)) << c.m << "x" << c.n << "x" << c.k << " fp32";
    DeviceBuffer<bf16_bits> out16(test::bits(c0));
    gemm.run(c.m, c.n, c.k, da.get(), c.ta, db.get(), c.tb, out16.get(), false, 0.5f, 2.0f, nullptr);
    EXPECT_TRUE(test::close_to(test::floats(out16.download()), ref, top / 128, 0)) << c.m << "x" << c.n << "x" << c.k << " bf16";
  }
}

}  // namespace trainyard::kernels
