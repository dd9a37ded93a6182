// CodeQuant's lookup-table matmul on the CPU: y[b, i] = sum_j C[i, j / G, a[i, j]] * Q_a(x)[b, j].
//
// Inputs (checked again here, though the Python wrapper validates first and raises rankwise errors):
//   x         [B, in]       fp32 activations, quantized here per token exactly as act_quant.token_codes does
//   act_bits  activation bits in [2, 16]
//   packed    [out, in / 2] uint8, two 4-bit weight codes a byte, the low nibble the even column
//   centroids [out, in / G, 16] fp32, the 16 centroids of each (row, group of G input columns)
//   impl      0 auto (widest ISA the CPU has), 1 scalar, 2 AVX2 + FMA, 3 AVX-512F
// Output      [B, out] fp32: y[b, i] = sum_j C[i, j / G, a[i, j]] * x_hat[b, j], x_hat = q * scale + min.
//
// Why it is fast: a weight is half a byte in memory instead of four, and its value never goes through memory:
// the 16 centroids of a (row, group) sit in registers and the codes index them in-register (AVX-512: one vpermps
// over 16 lanes; AVX2: two 8-lane vpermps and a blend on the code's bit 3). Each dequantized weight vector is reused
// over a chunk of batch rows (8 with AVX-512, 4 with AVX2) before the next codes are read; with AVX-512 from 4
// batch rows on, two weight rows also share each activation load.
//
// Layout trick: the lookups read the codes in their packed order (a byte holds columns 2t and 2t + 1; a 32-bit lane
// of a wide block holds 8 columns), and the activations are copied once per call into the order the lookups yield
// (block_order), so no shuffle is needed per weight. This needs groups to start on a byte, i.e. G even; an odd G
// (legal, but no one clusters that way) runs the scalar path.
//
// Portable to any x86-64: no -march flags; the vector paths carry __attribute__((target)) and are chosen at run
// time with __builtin_cpu_supports, the scalar path is plain C++.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define RW_X86 1
#else
#define RW_X86 0
#endif

namespace {

enum Impl : int64_t { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3 };

struct Problem {
  const float* x;        // [B, in] quantized activations, in the block order of the chosen path (plain for scalar)
  const uint8_t* codes;  // [out, in / 2]
  const float* cent;     // [out, ng, 16]
  float* y;              // [B, out]
  int64_t batch, in, out, group, ngroups;
};

inline int code_at(const uint8_t* row_codes, int64_t j) {
  const uint8_t byte = row_codes[j >> 1];
  return (j & 1) ? (byte >> 4) : (byte & 0x0F);
}

// ---------------------------------------------------------------------------------------------------------------
// Scalar path: dequantize one row into a buffer, then one dot product per batch row (the buffer is reused across
// the batch; four partial sums so the compiler can keep them in one SSE register). Used for odd G, for CPUs without
// AVX2, and forced by the tests.
void rows_scalar(const Problem& p, int64_t begin, int64_t end) {
  std::vector<float> w(static_cast<size_t>(p.in));
  for (int64_t i = begin; i < end; ++i) {
    const uint8_t* rc = p.codes + i * (p.in / 2);
    for (int64_t g = 0; g < p.ngroups; ++g) {
      const float* gcent = p.cent + (i * p.ngroups + g) * 16;
      for (int64_t j = g * p.group; j < (g + 1) * p.group; ++j) w[j] = gcent[code_at(rc, j)];
    }
    for (int64_t b = 0; b < p.batch; ++b) {
      const float* xb = p.x + b * p.in;
      float s[4] = {0.f, 0.f, 0.f, 0.f};
      int64_t j = 0;
      for (; j + 4 <= p.in; j += 4)
        for (int t = 0; t < 4; ++t) s[t] += w[j + t] * xb[j + t];
      for (; j < p.in; ++j) s[0] += w[j] * xb[j];
      p.y[b * p.out + i] = (s[0] + s[1]) + (s[2] + s[3]);
    }
  }
}

// Q_a(x) per token, the same IEEE operations in the same order as act_quant.token_codes followed by
// `codes * scale + min` in fp32 (no fused multiply-add: the file is built with -ffp-contract=off), so the kernel
// sees exactly the activations the reference quantizes. Returns false, before any matmul work, on NaN or inf.
bool quantize_tokens(const float* x, float* x_hat, int64_t batch, int64_t in, int64_t bits) {
  const float levels = static_cast<float>((int64_t{1} << bits) - 1);
  const float min_scale = static_cast<float>(1e-5);  // act_quant.MIN_SCALE, as torch's clamp_min casts it
  for (int64_t b = 0; b < batch; ++b) {
    const float* xb = x + b * in;
    float lo = xb[0], hi = xb[0];
    for (int64_t j = 0; j < in; ++j) {
      if (!std::isfinite(xb[j])) return false;
      lo = std::min(lo, xb[j]);
      hi = std::max(hi, xb[j]);
    }
    const float scale = std::max((hi - lo) / levels, min_scale);
    float* hb = x_hat + b * in;
    for (int64_t j = 0; j < in; ++j) {
      const float q = std::min(std::max(std::nearbyint((xb[j] - lo) / scale), 0.f), levels);  // half to even
      hb[j] = q * scale + lo;
    }
  }
  return true;
}

// The activation order of the vector paths, so that the weights a lookup yields meet their activations without a
// shuffle. Within each group, from its first column:
//  - AVX-512 only, wide blocks of 128 columns (64 bytes of codes, 16 32-bit lanes of 8 nibbles each): lane t of
//    the k-th 4-bit shift holds column 8t + k, so position 16k + t of the block gets column 8t + k;
//  - blocks of `blk` columns (32 AVX-512, 16 AVX2) widened byte by byte: [the even columns, the odd columns];
//  - the group's last columns, past its last full block, stay in column order (the scalar tail reads them).
void block_order(const float* x, float* dst, int64_t batch, int64_t in, int64_t group, int64_t wide, int64_t blk) {
  const int64_t half = blk / 2;
  for (int64_t b = 0; b < batch; ++b) {
    const float* xb = x + b * in;
    float* db = dst + b * in;
    for (int64_t g0 = 0; g0 < in; g0 += group) {
      int64_t j = g0;
      for (; wide && j + wide <= g0 + group; j += wide)
        for (int64_t k = 0; k < 8; ++k)
          for (int64_t t = 0; t < 16; ++t) db[j + 16 * k + t] = xb[j + 8 * t + k];
      for (; j + blk <= g0 + group; j += blk)
        for (int64_t t = 0; t < half; ++t) {
          db[j + t] = xb[j + 2 * t];
          db[j + half + t] = xb[j + 2 * t + 1];
        }
      for (; j < g0 + group; ++j) db[j] = xb[j];
    }
  }
}

// The columns of a group past its last full block, in column order, for NB batch rows.
template <int NB>
inline void tail_scalar(const Problem& p, const uint8_t* rc, const float* gcent, int64_t j0, int64_t j1, int64_t b0,
                        float* part) {
  for (int64_t j = j0; j < j1; ++j) {
    const float w = gcent[code_at(rc, j)];
    for (int r = 0; r < NB; ++r) part[r] += w * p.x[(b0 + r) * p.in + j];
  }
}

#if RW_X86
// ---------------------------------------------------------------------------------------------------------------
// AVX-512F: vpermps over a zmm looks up 16 centroids at once, indexed by each 32-bit lane's low 4 bits. A wide
// block (128 columns) loads 64 bytes as they are and shifts them by 4 k (k = 0..7) to bring each nibble down: one
// shift and one lookup per 16 weights, no widening. Then 32-column blocks (16 bytes widened to lanes, even and
// odd nibbles) for what is left of the group, then the scalar tail. A = 8 / NB accumulators per batch row: at
// batch 1 a single FMA chain would wait on the FMA latency (4 cycles) rather than on the lookups.
//
// From 4 batch rows on, the loads of activations (one per FMA) rather than the lookups bound the loop, so R = 2
// weight rows share each activation load. Accumulators: A = max(1, 8 / (R NB)) per (weight row, batch row).
template <int R, int NB>
__attribute__((target("avx512f"))) void rows_block_avx512(const Problem& p, int64_t i, int64_t b0) {
  constexpr int A = 8 / (R * NB) > 0 ? 8 / (R * NB) : 1;
  const int64_t row_bytes = p.in / 2;
  const uint8_t* rc = p.codes + i * row_bytes;
  __m512 acc[R][NB][A];
  for (int q = 0; q < R; ++q)
    for (int r = 0; r < NB; ++r)
      for (int a = 0; a < A; ++a) acc[q][r][a] = _mm512_setzero_ps();
  float part[R][NB] = {};
  const float* xs[NB];
  for (int r = 0; r < NB; ++r) xs[r] = p.x + (b0 + r) * p.in;
  for (int64_t g = 0; g < p.ngroups; ++g) {
    __m512 table[R];
    for (int q = 0; q < R; ++q) table[q] = _mm512_loadu_ps(p.cent + ((i + q) * p.ngroups + g) * 16);
    const int64_t g0 = g * p.group, g1 = g0 + p.group;
    int64_t j = g0;
    for (; j + 128 <= g1; j += 128) {
      __m512i v[R];
      for (int q = 0; q < R; ++q) v[q] = _mm512_loadu_si512(rc + q * row_bytes + j / 2);
      for (int k = 0; k < 8; ++k) {
        __m512 w[R];
        for (int q = 0; q < R; ++q) w[q] = _mm512_permutexvar_ps(k ? _mm512_srli_epi32(v[q], 4 * k) : v[q], table[q]);
        for (int r = 0; r < NB; ++r) {
          const __m512 xv = _mm512_loadu_ps(xs[r] + j + 16 * k);
          for (int q = 0; q < R; ++q) acc[q][r][k % A] = _mm512_fmadd_ps(w[q], xv, acc[q][r][k % A]);
        }
      }
    }
    for (; j + 32 <= g1; j += 32)
      for (int q = 0; q < R; ++q) {
        const __m512i v = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(rc + q * row_bytes + j / 2)));
        const __m512 we = _mm512_permutexvar_ps(v, table[q]);                      // low nibbles: even columns
        const __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table[q]);  // high nibbles: odd columns
        for (int r = 0; r < NB; ++r) {
          acc[q][r][0] = _mm512_fmadd_ps(we, _mm512_loadu_ps(xs[r] + j), acc[q][r][0]);
          acc[q][r][1 % A] = _mm512_fmadd_ps(wo, _mm512_loadu_ps(xs[r] + j + 16), acc[q][r][1 % A]);
        }
      }
    for (int q = 0; q < R; ++q)
      tail_scalar<NB>(p, rc + q * row_bytes, p.cent + ((i + q) * p.ngroups + g) * 16, j, g1, b0, part[q]);
  }
  for (int q = 0; q < R; ++q)
    for (int r = 0; r < NB; ++r) {
      __m512 s = acc[q][r][0];
      for (int a = 1; a < A; ++a) s = _mm512_add_ps(s, acc[q][r][a]);
      p.y[(b0 + r) * p.out + i + q] = _mm512_reduce_add_ps(s) + part[q][r];
    }
}

// Batch rows in chunks of NB for one block of R weight rows.
template <int R>
__attribute__((target("avx512f"))) void batch_avx512(const Problem& p, int64_t i) {
  int64_t b = 0;
  for (; b + 8 <= p.batch; b += 8) rows_block_avx512<R, 8>(p, i, b);
  if (b + 4 <= p.batch) { rows_block_avx512<R, 4>(p, i, b); b += 4; }
  if (b + 2 <= p.batch) { rows_block_avx512<1, 2>(p, i, b); if (R == 2) rows_block_avx512<1, 2>(p, i + 1, b); b += 2; }
  if (b < p.batch) { rows_block_avx512<1, 1>(p, i, b); if (R == 2) rows_block_avx512<1, 1>(p, i + 1, b); }
}

__attribute__((target("avx512f"))) void rows_avx512(const Problem& p, int64_t begin, int64_t end) {
  int64_t i = begin;
  if (p.batch >= 4)
    for (; i + 2 <= end; i += 2) batch_avx512<2>(p, i);
  for (; i < end; ++i) batch_avx512<1>(p, i);
}

// ---------------------------------------------------------------------------------------------------------------
// AVX2 + FMA: a block is 16 columns = 8 bytes of codes; two 8-lane vpermps (centroids 0-7 and 8-15, indexed by the
// code's bits 0-2) and a blend on its bit 3, moved to the sign bit by a shift. At batch 1, U = 2 blocks per
// iteration with accumulators of their own, so that the FMA latency does not bound the loop.
template <int NB, int U>
__attribute__((target("avx2,fma"))) void row_avx2(const Problem& p, int64_t i, int64_t b0) {
  const uint8_t* rc = p.codes + i * (p.in / 2);
  __m256 acc[NB][2 * U];
  for (int r = 0; r < NB; ++r)
    for (int u = 0; u < 2 * U; ++u) acc[r][u] = _mm256_setzero_ps();
  float part[NB] = {};
  const float* xs[NB];
  for (int r = 0; r < NB; ++r) xs[r] = p.x + (b0 + r) * p.in;
  for (int64_t g = 0; g < p.ngroups; ++g) {
    const float* gcent = p.cent + (i * p.ngroups + g) * 16;
    const __m256 lo = _mm256_loadu_ps(gcent), hi = _mm256_loadu_ps(gcent + 8);
    const int64_t g0 = g * p.group, g1 = g0 + p.group;
    int64_t j = g0;
    // the U-block loop, then single blocks (u = 0 only) for the rest of the group
    for (int step = U; step >= 1; step = (step == 1 ? 0 : 1))
      for (; j + 16 * step <= g1; j += 16 * step)
        for (int u = 0; u < step; ++u) {
          const int64_t c = j + 16 * u;
          const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rc + c / 2)));
          const __m256i vh = _mm256_srli_epi32(v, 4);
          const __m256 we = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, v), _mm256_permutevar8x32_ps(hi, v),
                                             _mm256_castsi256_ps(_mm256_slli_epi32(v, 28)));   // bit 3 -> sign
          const __m256 wo = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, vh), _mm256_permutevar8x32_ps(hi, vh),
                                             _mm256_castsi256_ps(_mm256_slli_epi32(v, 24)));   // bit 7 -> sign
          for (int r = 0; r < NB; ++r) {
            acc[r][2 * u] = _mm256_fmadd_ps(we, _mm256_loadu_ps(xs[r] + c), acc[r][2 * u]);
            acc[r][2 * u + 1] = _mm256_fmadd_ps(wo, _mm256_loadu_ps(xs[r] + c + 8), acc[r][2 * u + 1]);
          }
        }
    tail_scalar<NB>(p, rc, gcent, j, g1, b0, part);
  }
  for (int r = 0; r < NB; ++r) {
    __m256 s = acc[r][0];
    for (int u = 1; u < 2 * U; ++u) s = _mm256_add_ps(s, acc[r][u]);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
    p.y[(b0 + r) * p.out + i] = _mm_cvtss_f32(q) + part[r];
  }
}

__attribute__((target("avx2,fma"))) void rows_avx2(const Problem& p, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    int64_t b = 0;
    for (; b + 4 <= p.batch; b += 4) row_avx2<4, 1>(p, i, b);
    if (b + 2 <= p.batch) { row_avx2<2, 1>(p, i, b); b += 2; }
    if (b < p.batch) row_avx2<1, 2>(p, i, b);
  }
}
#endif

bool has_avx2() {
#if RW_X86
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool has_avx512() {
#if RW_X86
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// The path `requested` resolves to on this CPU; an explicit request the CPU cannot run is an error.
int64_t resolve(int64_t requested) {
  if (requested == kAuto) return has_avx512() ? kAvx512 : (has_avx2() ? kAvx2 : kScalar);
  TORCH_CHECK(requested >= kScalar && requested <= kAvx512, "lut_matmul: unknown impl ", requested);
  TORCH_CHECK(requested != kAvx512 || has_avx512(), "lut_matmul: this CPU has no AVX-512F");
  TORCH_CHECK(requested != kAvx2 || has_avx2(), "lut_matmul: this CPU has no AVX2 + FMA");
  return requested;
}

// The marker the Python wrapper turns into rankwise's NumericalError.
constexpr const char* kNonFinite = "rankwise_lut_nonfinite: activations contain NaN or infinity: nothing to quantize";

at::Tensor quantize(const at::Tensor& x, int64_t bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) > 0, "quantize: x must be fp32 [B, in > 0]");
  TORCH_CHECK(bits >= 2 && bits <= 16, "quantize: bits must lie in [2, 16]");
  const at::Tensor xc = x.contiguous();
  at::Tensor x_hat = at::empty_like(xc);
  TORCH_CHECK(quantize_tokens(xc.data_ptr<float>(), x_hat.data_ptr<float>(), xc.size(0), xc.size(1), bits),
              kNonFinite);
  return x_hat;
}

at::Tensor lut_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& centroids, int64_t act_bits,
                      int64_t impl) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "lut_matmul: x must be fp32 [B, in]");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte, "lut_matmul: packed must be uint8 [out, in/2]");
  TORCH_CHECK(centroids.dim() == 3 && centroids.scalar_type() == at::kFloat && centroids.size(2) == 16,
              "lut_matmul: centroids must be fp32 [out, in/G, 16]");
  const int64_t batch = x.size(0), in = x.size(1), out = packed.size(0), ng = centroids.size(1);
  TORCH_CHECK(in > 0 && packed.size(1) * 2 == in && centroids.size(0) == out && ng > 0 && in % ng == 0,
              "lut_matmul: shapes do not match: x ", x.sizes(), ", packed ", packed.sizes(), ", centroids ",
              centroids.sizes());
  const int64_t group = in / ng;
  int64_t path = resolve(impl);
  if (group % 2) path = kScalar;  // groups must start on a byte for the vector paths (see the top of the file)
  at::Tensor y = at::empty({batch, out}, x.options());
  if (batch == 0) return y;

  at::Tensor x_hat = quantize(x, act_bits);  // checks NaN / inf first, before any matmul work
  if (out == 0) return y;
  at::Tensor xo = x_hat;
  if (path != kScalar) {
    xo = at::empty_like(x_hat);
    const bool avx512 = path == kAvx512;
    block_order(x_hat.data_ptr<float>(), xo.data_ptr<float>(), batch, in, group, avx512 ? 128 : 0, avx512 ? 32 : 16);
  }
  const at::Tensor pc = packed.contiguous(), cc = centroids.contiguous();
  const Problem p{xo.data_ptr<float>(), pc.data_ptr<uint8_t>(), cc.data_ptr<float>(), y.data_ptr<float>(),
                  batch, in, out, group, ng};
  // Rows are independent; a grain of ~16k weights keeps the per-chunk work well above the thread start-up cost.
  const int64_t grain = std::max<int64_t>(1, 16384 / in);
  at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) {
#if RW_X86
    if (path == kAvx512) return rows_avx512(p, begin, end);
    if (path == kAvx2) return rows_avx2(p, begin, end);
#endif
    rows_scalar(p, begin, end);
  });
  return y;
}

// Whether this CPU can run `impl` (auto and scalar: always), so the wrapper can refuse a forced path before work.
bool supports(int64_t impl) {
  return impl == kAuto || impl == kScalar || (impl == kAvx2 && has_avx2()) || (impl == kAvx512 && has_avx512());
}

int64_t resolved_impl(int64_t requested) { return resolve(requested); }

}  // namespace

TORCH_LIBRARY(rankwise_codequant_lut, m) {
  m.def("lut_matmul(Tensor x, Tensor packed, Tensor centroids, int act_bits, int impl) -> Tensor");
  m.def("quantize(Tensor x, int bits) -> Tensor");
  m.def("resolved_impl(int impl) -> int", &resolved_impl);
  m.def("supports(int impl) -> bool", &supports);
}

TORCH_LIBRARY_IMPL(rankwise_codequant_lut, CPU, m) {
  m.impl("lut_matmul", &lut_matmul);
  m.impl("quantize", &quantize);
}
