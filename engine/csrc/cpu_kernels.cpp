// Fused CPU kernels for the engine's decode path.
//
// On a small model the per-op dispatch cost of eager PyTorch rivals the matmuls,
// and attention over gathered K/V copies every cached block once more per layer. These kernels fuse the elementwise
// work of a layer into a few calls and attend straight from the paged cache. Every kernel accumulates in
// at::opmath_type (float for bf16/fp16/fp32, double for fp64) and rounds where transformers rounds.
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__AVX512BF16__)
constexpr bool kPairedKeys = true;  // bf16 K caches may use the dim-paired layout (see paged_attention)
#else
constexpr bool kPairedKeys = false;
#endif

namespace {

template <typename T>
using acc_t = at::opmath_type<T>;

// Conversions written on the raw bits, so loops over them vectorise (c10's own bf16 cast branches on NaN).
template <typename T>
inline acc_t<T> ld(T v) {
  return static_cast<acc_t<T>>(v);
}
template <>
inline float ld<c10::BFloat16>(c10::BFloat16 v) {
  uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
template <typename T>
inline T st(acc_t<T> v) {
  return static_cast<T>(v);
}
template <>
inline c10::BFloat16 st<c10::BFloat16>(float v) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  u += 0x7FFFu + ((u >> 16) & 1u);
  return c10::BFloat16(static_cast<uint16_t>(u >> 16), c10::BFloat16::from_bits());
}

template <typename T>
inline acc_t<T> rms_scale(const T* x, int64_t d, double eps) {
  using A = acc_t<T>;
  A ss = 0;
_Pragma("omp simd reduction(+ : ss)")
  for (int64_t i = 0; i < d; ++i) {
    A v = ld(x[i]);
    ss += v * v;
  }
  return A(1) / std::sqrt(ss / A(d) + A(eps));
}

// out = w * (x * rsqrt(mean(x^2) + eps)), the normalised value rounded to T before the weight, as transformers does.
template <typename T>
inline void rms_norm_row(const T* x, const T* w, T* out, int64_t d, double eps) {
  using A = acc_t<T>;
  A inv = rms_scale(x, d, eps);
_Pragma("omp simd")
  for (int64_t i = 0; i < d; ++i) {
    T y = st<T>(ld(x[i]) * inv);
    out[i] = st<T>(ld(y) * ld(w[i]));
  }
}

// acc[i][0..64) = e_i @ w for up to kLowrankRows rows e_i [R] and one chunk w [R, 64] of W2^T packed by
// engine.ops.lowrank_chunks, accumulated over r in order: the rows' 64-wide output slices stay in registers while the
// chunk's 8 KB (bf16) stream past in one contiguous run, each weight converted once for all the rows. (Read from the
// plain [R, V] layout, a row at a time, the whole Markov loop (markov_greedy) was markedly slower.)
constexpr int64_t kLowrankChunk = 64;
constexpr int64_t kLowrankRows = 4;
template <typename T, int64_t NB>
inline void lowrank_chunk(const T* const* e, const T* w, int64_t R, float (*acc)[kLowrankChunk]) {
  for (int64_t i = 0; i < NB; ++i)
    for (int64_t j = 0; j < kLowrankChunk; ++j) acc[i][j] = 0.0f;
  for (int64_t r = 0; r < R; ++r) {
    const T* row = w + r * kLowrankChunk;
    float wr[kLowrankChunk];
    _Pragma("omp simd")
    for (int64_t j = 0; j < kLowrankChunk; ++j) wr[j] = static_cast<float>(ld(row[j]));
    for (int64_t i = 0; i < NB; ++i) {
      const float er = static_cast<float>(ld(e[i][r]));
      _Pragma("omp simd")
      for (int64_t j = 0; j < kLowrankChunk; ++j) acc[i][j] += er * wr[j];
    }
  }
}

// The low-rank kernels' work items: each chunk of W2^T for each group of up to kLowrankRows rows of a batch of B.
inline int64_t lowrank_groups(int64_t B) { return (B + kLowrankRows - 1) / kLowrankRows; }

// Work item w in [0, chunks * lowrank_groups(B)): chunk c of W2^T (packed) for the rows b0 .. b0 + nb, row(b) giving
// e_b [R]; acc[i] gets row b0 + i's slice.
struct LowrankItem {
  int64_t c, b0, nb;
};
template <typename T, typename Row>
inline LowrankItem lowrank_item(int64_t w, int64_t B, int64_t R, const T* w2c, Row row, float (*acc)[kLowrankChunk]) {
  const int64_t groups = lowrank_groups(B);
  LowrankItem it{w / groups, (w % groups) * kLowrankRows, 0};
  it.nb = std::min(kLowrankRows, B - it.b0);
  const T* e[kLowrankRows];
  for (int64_t i = 0; i < it.nb; ++i) e[i] = row(it.b0 + i);
  const T* chunk = w2c + it.c * R * kLowrankChunk;
  switch (it.nb) {
    case 1: lowrank_chunk<T, 1>(e, chunk, R, acc); break;
    case 2: lowrank_chunk<T, 2>(e, chunk, R, acc); break;
    case 3: lowrank_chunk<T, 3>(e, chunk, R, acc); break;
    default: lowrank_chunk<T, kLowrankRows>(e, chunk, R, acc);
  }
  return it;
}

inline void check_lowrank_chunks(const at::Tensor& w2c, int64_t R, int64_t V) {
  TORCH_CHECK(w2c.is_contiguous() && w2c.dim() == 3 && w2c.size(1) == R && w2c.size(2) == kLowrankChunk &&
                  w2c.size(0) == (V + kLowrankChunk - 1) / kLowrankChunk,
              "w2c must be W2^T packed by engine.ops.lowrank_chunks: [ceil(V / 64), R, 64]");
}

// Rotate-half rope of one head x [2 * half] into dst: the first half with (c_lo, s_lo), the second with (c_hi, s_hi)
// (full-width tables pass their two halves, half tables the same pointers twice), in the accumulation type.
template <typename T, typename C>
inline void rope_row(const T* x, const C* c_lo, const C* s_lo, const C* c_hi, const C* s_hi, int64_t half, T* dst) {
  using A = acc_t<T>;
  _Pragma("omp simd")
  for (int64_t i = 0; i < half; ++i) {
    const A x1 = ld(x[i]), x2 = ld(x[i + half]);
    dst[i] = st<T>(x1 * A(ld(c_lo[i])) - x2 * A(ld(s_lo[i])));
    dst[i + half] = st<T>(x2 * A(ld(c_hi[i])) + x1 * A(ld(s_hi[i])));
  }
}

// bf16 weight tiles [N / 8, K / 32, 8, 32] (see TiledBF16).
constexpr int64_t kTileRows = 8, kTileCols = 32;

// A linear's weight argument: [N, K], or bf16 tiles [N / 8, K / 32, 8, 32].
struct WeightShape {
  int64_t N, K;
  bool tiled;
};
WeightShape weight_shape(const at::Tensor& w, const char* fn) {
  TORCH_CHECK(w.device().is_cpu() && w.is_contiguous(), fn, ": w must be a contiguous CPU tensor");
  if (w.dim() == 4) {
    TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.size(2) == kTileRows && w.size(3) == kTileCols, fn,
                ": a 4-d weight must be bf16 tiles [N / 8, K / 32, 8, 32]");
    return {w.size(0) * kTileRows, w.size(1) * kTileCols, true};
  }
  TORCH_CHECK(w.dim() == 2, fn, ": w must be [N, K] or bf16 tiles [N / 8, K / 32, 8, 32]");
  return {w.size(0), w.size(1), false};
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

}  // namespace

// Rows per thread of the norms: small enough that a decode step's few rows already split across the cores.
constexpr int64_t kNormGrain = 8;

// out[t] = rms_norm(x[t]) * w
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_rows(x, "x");
  auto out = at::empty_like(x);
  const int64_t d = x.size(-1), rows = x.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kNormGrain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) rms_norm_row(xp + r * d, wp, op + r * d, d, eps);
    });
  });
  return out;
}

// residual += x (rounded to the model dtype, like `h = h + x`), then returns rms_norm(residual) * w.
at::Tensor add_rms_norm(const at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps) {
  check_rows(x, "x");
  check_rows(residual, "residual");
  auto out = at::empty_like(x);
  const int64_t d = x.size(-1), rows = x.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* rp = residual.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kNormGrain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        scalar_t* rr = rp + r * d;
        const scalar_t* xr = xp + r * d;
_Pragma("omp simd")
        for (int64_t i = 0; i < d; ++i) rr[i] = st<scalar_t>(ld(rr[i]) + ld(xr[i]));
        rms_norm_row(rr, wp, op + r * d, d, eps);
      }
    });
  });
  return out;
}

// qkv [T, (H + 2 Hkv) D] -> q [T, H, D]. Applies the optional per-head q/k RMSNorm and rotary embedding (half-split
// layout, cos/sin [T, D] already gathered per position), and writes k and v into the paged caches at `slots`:
// K into [num_blocks, Hkv, D, block_size] (or, paired, [num_blocks, Hkv, D / 2, block_size, 2]), V into
// [num_blocks, block_size, Hkv, D].
at::Tensor rope_and_cache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                          const at::Tensor& slots, at::Tensor& k_cache, at::Tensor& v_cache, int64_t num_heads,
                          int64_t num_kv_heads, const c10::optional<at::Tensor>& q_norm,
                          const c10::optional<at::Tensor>& k_norm, double eps) {
  TORCH_CHECK(qkv.device().is_cpu() && qkv.dim() == 2 && qkv.stride(1) == 1, "qkv must be CPU rows with unit stride");
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  const int64_t T = qkv.size(0), D = v_cache.size(-1), BS = v_cache.size(1), half = D / 2;
  const bool paired = k_cache.dim() == 5;
  const int64_t H = num_heads, Hkv = num_kv_heads, width = (H + 2 * Hkv) * D, row_stride = qkv.stride(0);
  TORCH_CHECK(qkv.size(1) == width, "qkv width does not match the head counts");
  auto q_out = at::empty({T, H, D}, qkv.options());
  const int64_t* sp = slots.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rope_and_cache", [&] {
    const scalar_t* qp = qkv.data_ptr<scalar_t>();
    const scalar_t* cp = cos.data_ptr<scalar_t>();
    const scalar_t* snp = sin.data_ptr<scalar_t>();
    const scalar_t* qn = q_norm ? q_norm->data_ptr<scalar_t>() : nullptr;
    const scalar_t* kn = k_norm ? k_norm->data_ptr<scalar_t>() : nullptr;
    scalar_t* qo = q_out.data_ptr<scalar_t>();
    scalar_t* kc = k_cache.data_ptr<scalar_t>();
    scalar_t* vc = v_cache.data_ptr<scalar_t>();
    at::parallel_for(0, T, 4, [&](int64_t b, int64_t e) {
      std::vector<scalar_t> tmp(D), kbuf(D);
      for (int64_t t = b; t < e; ++t) {
        const scalar_t* row = qp + t * row_stride;
        const scalar_t* c = cp + t * D;
        const scalar_t* s = snp + t * D;
        auto rope = [&](const scalar_t* x, const scalar_t* norm_w, scalar_t* dst) {
          if (norm_w) {
            rms_norm_row(x, norm_w, tmp.data(), D, eps);
            x = tmp.data();
          }
          rope_row(x, c, s, c + half, s + half, half, dst);
        };
        for (int64_t h = 0; h < H; ++h) rope(row + h * D, qn, qo + (t * H + h) * D);
        const int64_t slot = sp[t];
        const int64_t blk = slot / BS, off = slot % BS;
        for (int64_t h = 0; h < Hkv; ++h) {
          rope(row + (H + h) * D, kn, kbuf.data());
          scalar_t* kd = kc + (blk * Hkv + h) * D * BS;
          if (paired) {
            for (int64_t i = 0; i < D; ++i) kd[((i >> 1) * BS + off) * 2 + (i & 1)] = kbuf[i];
          } else {
            for (int64_t i = 0; i < D; ++i) kd[i * BS + off] = kbuf[i];
          }
          const scalar_t* v = row + (H + Hkv + h) * D;
          scalar_t* vd = vc + (slot * Hkv + h) * D;
          for (int64_t i = 0; i < D; ++i) vd[i] = v[i];
        }
      }
    });
  });
  return q_out;
}

// exp for x <= 0 in a form the compiler vectorises (libm's is scalar here): 2^n * p(r) with a degree-7 polynomial,
// relative error below 2e-7. fp64 keeps std::exp.
__attribute__((always_inline)) inline float exp_nonpos(float x) {
  x = std::max(x, -87.0f);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick: std::floor would keep GCC from vectorising the loops this is in.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693145751953125f - n * 1.42860682030941723e-06f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}
inline double exp_nonpos(double x) { return std::exp(x); }

// dst[i] = src[i] in the accumulation type. bf16 is read as raw bits: GCC does not vectorise loads of the
// c10::BFloat16 struct.
template <typename T>
inline void to_acc(const T* src, acc_t<T>* dst, int64_t n) {
  _Pragma("omp simd")
  for (int64_t i = 0; i < n; ++i) dst[i] = ld(src[i]);
}
template <>
inline void to_acc<c10::BFloat16>(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* raw = reinterpret_cast<const uint16_t*>(src);
  _Pragma("omp simd")
  for (int64_t i = 0; i < n; ++i) dst[i] = __builtin_bit_cast(float, static_cast<uint32_t>(raw[i]) << 16);
}

constexpr int64_t kLanes = 16;  // keys (or head dims) per register-resident accumulator
// Blocks of K (and V) requested ahead of the one being read. The hardware prefetcher does not run ahead across the
// scattered 2 KB tiles of a block table; without this the kernel reads the cache well below the memory's bandwidth.
constexpr int64_t kPrefetchBlocks = 2;  // 1 and 2 measured alike, 4 slower into L1, level into L2 (below)

// Requested into L2 (prefetcht1), not L1: a block's 32-64 lines at once held the core's few L1 miss buffers, which
// matters on hosts whose memory serves few streams at a time (in cache, at a few sequences, it is level).
inline void prefetch_lines(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 2);
}

// Softmax numerators of `rows` score rows over their visible keys 0 .. limit[r] (the rest set to 0); 1 / sum goes
// to inv_sum and is applied to the output.
template <typename A>
inline void softmax_rows(A* scores, const int64_t* limit, int64_t rows, int64_t Lp, A* inv_sum) {
  for (int64_t r = 0; r < rows; ++r) {
    A* sr = scores + r * Lp;
    const int64_t n = limit[r] + 1;
    A m = sr[0];
    _Pragma("omp simd reduction(max : m)")
    for (int64_t j = 0; j < n; ++j) m = std::max(m, sr[j]);
    // kLanes partial sums (key j into j mod kLanes) added in order: an order fixed by the row's length alone, so a
    // position sums the same wherever its row sits. An `omp simd` reduction may split the loop by the address's
    // alignment instead.
    A part[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) {
      _Pragma("omp simd")
      for (int64_t l = 0; l < kLanes; ++l) {
        sr[j + l] = exp_nonpos(sr[j + l] - m);
        part[l] += sr[j + l];
      }
    }
    for (int64_t l = 0; j + l < n; ++l) {
      sr[j + l] = exp_nonpos(sr[j + l] - m);
      part[l] += sr[j + l];
    }
    A sum = 0;
    for (int64_t l = 0; l < kLanes; ++l) sum += part[l];
    for (j = n; j < Lp; ++j) sr[j] = A(0);
    inv_sum[r] = A(1) / sum;
  }
}

// Register-blocked attention for one (sequence, KV head) on fp32 or bf16 rows, written once over a vector type:
// 16 floats in a zmm register on AVX-512, 8 in a ymm on AVX2 + FMA. The query rows of a head go through each K or V
// load together, with their accumulators in registers.
#if defined(__AVX512F__)
#define DSPARK_REGISTER_BLOCKED 1
struct Vec {
  using reg = __m512;
  static constexpr int64_t lanes = 16;
  // Value accumulators a row group keeps in registers (R rows x NV vectors): 32 zmm registers hold 4 x 4 and the loads.
  static constexpr int max_nv(int) { return 4; }
  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float x) { return _mm512_set1_ps(x); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static reg load(const c10::BFloat16* p) {  // widened to fp32 (exact)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
  }
  static reg load(const int8_t* p) {  // converted to fp32 (exact)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
  }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static void store(c10::BFloat16* p, reg v) {  // round to nearest even, as st<BFloat16>
#if defined(__AVX512BF16__)
    _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v));
#else
    alignas(64) float f[lanes];
    _mm512_store_ps(f, v);
    for (int64_t l = 0; l < lanes; ++l) p[l] = st<c10::BFloat16>(f[l]);
#endif
  }
};
#elif defined(__AVX2__) && defined(__FMA__)
#define DSPARK_REGISTER_BLOCKED 1
struct Vec {
  using reg = __m256;
  static constexpr int64_t lanes = 8;
  // 16 ymm registers: 4 rows keep 2 vectors each, 1-2 rows keep 4 (the accumulators plus the loads and a broadcast).
  static constexpr int max_nv(int rows) { return rows >= 3 ? 2 : 4; }
  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static reg load(const c10::BFloat16* p) {  // widened to fp32 (exact)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
  }
  static reg load(const int8_t* p) {  // converted to fp32 (exact)
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
  }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static void store(c10::BFloat16* p, reg v) {  // round to nearest even, as st<BFloat16>
    alignas(32) float f[lanes];
    _mm256_store_ps(f, v);
    for (int64_t l = 0; l < lanes; ++l) p[l] = st<c10::BFloat16>(f[l]);
  }
};
#endif

#if defined(DSPARK_REGISTER_BLOCKED)
using vreg = Vec::reg;

// Scores of R query rows against one block of keys, dst[r][j] = scale * sum_d q_r[d] K[d, j]; C = 2 chains per row
// (dims d = c mod C), summed in order: the same for every R, so a query row scores the same bits in any group (a
// decode row, a verify segment, a prefill chunk). More chains for groups of 1-2 rows would cover latency better, but
// a segment's rows would then score differently by where the groups of 4 split it. K [D, BS] (transposed; bf16
// widened on load), or for bf16 with paired keys K [D / 2, BS, 2], where one vdpbf16ps takes two dims of 16 keys
// straight from the cache (products of two bf16 are exact in fp32).
template <int R, typename T>
inline void block_scores(const T* const* q, const T* kt, int64_t D, int64_t BS, bool paired, vreg vscale,
                         float* const* dst) {
  constexpr int C = 2;
  for (int64_t j0 = 0; j0 < BS; j0 += Vec::lanes) {
    vreg acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = Vec::zero();
#if defined(__AVX512BF16__)
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      if (paired) {
        for (int64_t p = 0; p < D / 2; p += C) {
          for (int c = 0; c < C; ++c) {
            const __m512bh k = (__m512bh)_mm512_loadu_si512(kt + ((p + c) * BS + j0) * 2);
            for (int r = 0; r < R; ++r) {  // two query dims per 32-bit word, low half first, as vdpbf16ps pairs them
              const int32_t qpair = reinterpret_cast<const int32_t*>(q[r])[p + c];
              acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)_mm512_set1_epi32(qpair), k);
            }
          }
        }
      }
    }
#endif
    if (!paired) {
      for (int64_t d = 0; d < D; d += C) {
        for (int c = 0; c < C; ++c) {
          const vreg k = Vec::load(kt + (d + c) * BS + j0);
          for (int r = 0; r < R; ++r) acc[r][c] = Vec::fma(Vec::set1(ld(q[r][d + c])), k, acc[r][c]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      vreg sum = acc[r][0];
      for (int c = 1; c < C; ++c) sum = Vec::add(sum, acc[r][c]);
      Vec::store(dst[r] + j0, Vec::mul(sum, vscale));
    }
  }
}

// One KV head's values of a block: BS rows of D elements, row_stride elements apart.
template <typename T>
inline void prefetch_v_block(const T* vc, int64_t block, int64_t BS, int64_t row_stride, int64_t kh, int64_t D) {
  const T* vb = vc + block * BS * row_stride + kh * D;
  for (int64_t j = 0; j < BS; ++j) prefetch_lines(vb + j * row_stride, D * sizeof(T));
}

// out_r[d0 .. d0 + NV lanes) = inv_sum_r * sum_j p_r[j] V[j, d0 ..] over every block, for R rows: the R x NV
// accumulators stay in registers across the blocks, and each V row is loaded (widened) once for all R rows.
template <int R, int NV, typename T>
inline void rows_pv(const float* const* prob, const float* inv_sum, const T* vc, const int64_t* table,
                    int64_t nblocks, int64_t BS, int64_t row_stride, int64_t kh, int64_t D, int64_t d0,
                    T* const* out, bool prefetch) {
  vreg acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = Vec::zero();
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    if (prefetch && d0 == 0 && blk + kPrefetchBlocks < nblocks)
      prefetch_v_block(vc, table[blk + kPrefetchBlocks], BS, row_stride, kh, D);
    const T* vb = vc + table[blk] * BS * row_stride + kh * D + d0;
    for (int64_t j = 0; j < BS; ++j) {
      vreg v[NV];
      for (int c = 0; c < NV; ++c) v[c] = Vec::load(vb + j * row_stride + c * Vec::lanes);
      for (int r = 0; r < R; ++r) {
        const vreg p = Vec::set1(prob[r][blk * BS + j]);
        for (int c = 0; c < NV; ++c) acc[r][c] = Vec::fma(p, v[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const vreg s = Vec::set1(inv_sum[r]);
    for (int c = 0; c < NV; ++c) Vec::store(out[r] + d0 + c * Vec::lanes, Vec::mul(acc[r][c], s));
  }
}

template <int R, typename T>
inline void pv(const float* const* prob, const float* inv_sum, const T* vc, const int64_t* table, int64_t nblocks,
               int64_t BS, int64_t row_stride, int64_t kh, int64_t D, T* const* out, bool prefetch) {
  constexpr int kMaxNV = Vec::max_nv(R);
  for (int64_t d0 = 0; d0 < D; d0 += kMaxNV * Vec::lanes) {
    auto run = [&](auto nv) {
      rows_pv<R, decltype(nv)::value>(prob, inv_sum, vc, table, nblocks, BS, row_stride, kh, D, d0, out, prefetch);
    };
    switch (std::min<int64_t>(kMaxNV, (D - d0) / Vec::lanes)) {
      case 4: run(std::integral_constant<int, std::min(4, kMaxNV)>()); break;
      case 3: run(std::integral_constant<int, std::min(3, kMaxNV)>()); break;
      case 2: run(std::integral_constant<int, 2>()); break;
      default: run(std::integral_constant<int, 1>()); break;
    }
  }
}

// One (sequence, KV head), from scores to the rounded output. Rows r = i * G + g (query i of the segment, query
// head kh * G + g), in groups of up to 4. K of block blk + kPrefetchBlocks is requested while block blk is scored,
// the value pass's first blocks at the end of the scores, and that pass requests its blocks ahead likewise.
// (Reading all KV heads of a block in one item, one contiguous read per block, measured slower.)
template <typename T>
void attention_item(const T* q, const T* kc, const T* vc, T* out, const int64_t* table, int64_t q0, int64_t qn,
                    int64_t L, int64_t H, int64_t kh, int64_t G, int64_t D, int64_t Hkv, int64_t BS, bool paired,
                    float scale, bool causal, float* scores, float* inv_sum, int64_t* limit) {
  const int64_t rows = qn * G, nblocks = (L + BS - 1) / BS, Lp = nblocks * BS;
  const int64_t row_stride = Hkv * D;  // V elements between consecutive keys
  const vreg vscale = Vec::set1(scale);
  for (int64_t r = 0; r < rows; ++r) limit[r] = causal ? L - qn + r / G : L - 1;  // last visible key
  auto groups = [&](auto&& body) {  // body(R, q row pointers, output row pointers, first row)
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const T* qr[4];
      T* orow[4];
      const int64_t R = std::min<int64_t>(4, rows - r0);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t i = (r0 + r) / G, g = (r0 + r) % G;
        qr[r] = q + ((q0 + i) * H + kh * G + g) * D;
        orow[r] = out + (q0 + i) * H * D + (kh * G + g) * D;
      }
      body(R, qr, orow, r0);
    }
  };
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t ahead = blk + kPrefetchBlocks;
    if (ahead < nblocks)
      prefetch_lines(kc + (table[ahead] * Hkv + kh) * D * BS, D * BS * sizeof(T));
    else
      prefetch_v_block(vc, table[ahead - nblocks], BS, row_stride, kh, D);
    const T* kt = kc + (table[blk] * Hkv + kh) * D * BS;
    groups([&](int64_t R, const T* const* qr, T* const*, int64_t r0) {
      float* dst[4];
      for (int64_t r = 0; r < R; ++r) dst[r] = scores + (r0 + r) * Lp + blk * BS;
      switch (R) {
        case 4: block_scores<4>(qr, kt, D, BS, paired, vscale, dst); break;
        case 3: block_scores<3>(qr, kt, D, BS, paired, vscale, dst); break;
        case 2: block_scores<2>(qr, kt, D, BS, paired, vscale, dst); break;
        default: block_scores<1>(qr, kt, D, BS, paired, vscale, dst); break;
      }
    });
  }
  softmax_rows(scores, limit, rows, Lp, inv_sum);
  groups([&](int64_t R, const T* const*, T* const* orow, int64_t r0) {
    const float* prob[4];
    for (int64_t r = 0; r < R; ++r) prob[r] = scores + (r0 + r) * Lp;
    const float* is = inv_sum + r0;
    const bool ahead = r0 == 0;  // the first pass over the blocks requests the later ones
    switch (R) {
      case 4: pv<4>(prob, is, vc, table, nblocks, BS, row_stride, kh, D, orow, ahead); break;
      case 3: pv<3>(prob, is, vc, table, nblocks, BS, row_stride, kh, D, orow, ahead); break;
      case 2: pv<2>(prob, is, vc, table, nblocks, BS, row_stride, kh, D, orow, ahead); break;
      default: pv<1>(prob, is, vc, table, nblocks, BS, row_stride, kh, D, orow, ahead); break;
    }
  });
}
#endif

// The register-blocked path over all (sequence, KV head) items, where it applies: fp32 or bf16 on a CPU with AVX-512
// or AVX2 + FMA. Returns false where the generic loop must run instead (fp64, fp16, other CPUs).
template <typename T>
bool register_blocked_attention(const T* q, const T* kc, const T* vc, T* out, const int64_t* cq, const int64_t* cl,
                                const int64_t* bt, int64_t B, int64_t MB, int64_t H, int64_t Hkv, int64_t G, int64_t D,
                                int64_t BS, bool paired, float scale, bool causal) {
#if defined(DSPARK_REGISTER_BLOCKED)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {
    at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores, inv_sum;
      std::vector<int64_t> limit;
      for (int64_t w = begin; w < end; ++w) {
        const int64_t b = w / Hkv, kh = w % Hkv;
        const int64_t q0 = cq[b], qn = cq[b + 1] - q0, L = cl[b], rows = qn * G;
        if (qn == 0) continue;
        if (w + 1 < end) {  // the next item's first key blocks, which its own prefetches miss
          const int64_t b1 = (w + 1) / Hkv, kh1 = (w + 1) % Hkv, n1 = (cl[b1] + BS - 1) / BS;
          for (int64_t blk = 0; blk < std::min(n1, kPrefetchBlocks); ++blk)
            prefetch_lines(kc + (bt[b1 * MB + blk] * Hkv + kh1) * D * BS, D * BS * sizeof(T));
        }
        scores.resize(rows * ((L + BS - 1) / BS) * BS);
        inv_sum.resize(rows);
        limit.resize(rows);
        attention_item(q, kc, vc, out, bt + b * MB, q0, qn, L, H, kh, G, D, Hkv, BS, paired, scale, causal, scores.data(),
                       inv_sum.data(), limit.data());
      }
    });
    return true;
  }
#endif
  return false;
}

// Attention of short query segments straight from the paged cache.
// q [T, H, D]: the queries of B sequences packed, sequence b owning rows cu_q[b] .. cu_q[b+1]-1, which sit at the
// last positions of its ctx_len[b] cached tokens; query i of a segment sees keys 0 .. ctx_len - q_len + i, or with
// causal false every key 0 .. ctx_len - 1 (the drafter's block, attended non-causally after its context).
// K cache [num_blocks, Hkv, D, block_size] (keys transposed within a block, so scores accumulate across keys with no
// horizontal sums); V cache [num_blocks, block_size, Hkv, D]; block_tables [B, max_blocks]. block_size and D must be
// multiples of 16. Returns [T, H * D].
// Paired keys (bf16 where the CPU has AVX512-BF16): K [num_blocks, Hkv, D / 2, block_size, 2], each pair of head dims
// of a key side by side, so one vdpbf16ps multiplies 16 keys by two query dims straight from the cache (the products
// of two bf16 values are exact in fp32) instead of widening the tile to fp32 first. The scale is applied to the sums.
// One work item is a (sequence, KV head): it reads that head's K and V once for all G query heads and all queries.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& cu_q, const at::Tensor& ctx_len, const at::Tensor& block_tables,
                           double scale, bool causal) {
  check_rows(q, "q");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t Hkv = k_cache.size(1), BS = k_cache.size(3), G = H / Hkv;
  const bool paired = k_cache.dim() == 5;
  TORCH_CHECK(!paired || (kPairedKeys && q.scalar_type() == at::kBFloat16 && k_cache.size(4) == 2),
              "paired keys need bf16 and a CPU with AVX512-BF16");
  TORCH_CHECK(k_cache.size(2) * (paired ? 2 : 1) == D && v_cache.size(1) == BS && v_cache.size(3) == D,
              "cache shapes do not match");
  TORCH_CHECK(BS % kLanes == 0 && D % kLanes == 0, "block_size and head_dim must be multiples of 16");
  const int64_t B = ctx_len.size(0), MB = block_tables.size(1);
  auto out = at::empty({T, H * D}, q.options());
  const int64_t* cq = cu_q.data_ptr<int64_t>();
  const int64_t* cl = ctx_len.data_ptr<int64_t>();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kc = k_cache.data_ptr<scalar_t>();
    const scalar_t* vc = v_cache.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    if (register_blocked_attention(qp, kc, vc, op, cq, cl, bt, B, MB, H, Hkv, G, D, BS, paired, float(scale), causal))
      return;
    at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
      std::vector<A> qbuf, scores, acc, inv_sum, tile(D * BS);
      std::vector<int64_t> limit;
      for (int64_t w = begin; w < end; ++w) {
        const int64_t b = w / Hkv, kh = w % Hkv;
        const int64_t q0 = cq[b], qn = cq[b + 1] - q0, L = cl[b], rows = qn * G;
        if (qn == 0) continue;
        const int64_t nblocks = (L + BS - 1) / BS, Lp = nblocks * BS;
        const int64_t* table = bt + b * MB;
        scores.resize(rows * Lp);
        inv_sum.resize(rows);
        limit.resize(rows);
        qbuf.resize(rows * D);
        acc.assign(rows * D, A(0));
        for (int64_t i = 0; i < qn; ++i) {
          for (int64_t g = 0; g < G; ++g) {
            const int64_t r = i * G + g;
            const scalar_t* src = qp + ((q0 + i) * H + kh * G + g) * D;
            for (int64_t d = 0; d < D; ++d) qbuf[r * D + d] = ld(src[d]) * A(scale);
            limit[r] = causal ? L - qn + i : L - 1;  // last visible key
          }
        }
        // Scores, a block of keys at a time: s[r, j] = sum_d q[r, d] * K[d, j], 16 keys per register.
        for (int64_t blk = 0; blk < nblocks; ++blk) {
          const scalar_t* kt = kc + (table[blk] * Hkv + kh) * D * BS;
          if (blk + kPrefetchBlocks < nblocks)
            prefetch_lines(kc + (table[blk + kPrefetchBlocks] * Hkv + kh) * D * BS, D * BS * sizeof(scalar_t));
          to_acc(kt, tile.data(), D * BS);
          for (int64_t r = 0; r < rows; ++r) {
            const A* qr = qbuf.data() + r * D;
            for (int64_t j0 = 0; j0 < BS; j0 += kLanes) {
              // Four partial sums over d (D is a multiple of 16): four independent FMA chains instead of one.
              A s0[kLanes] = {}, s1[kLanes] = {}, s2[kLanes] = {}, s3[kLanes] = {};
              for (int64_t d = 0; d < D; d += 4) {
                const A* kd = tile.data() + d * BS + j0;
                const A q0 = qr[d], q1 = qr[d + 1], q2 = qr[d + 2], q3 = qr[d + 3];
                _Pragma("omp simd")
                for (int64_t j = 0; j < kLanes; ++j) {
                  s0[j] += q0 * kd[j];
                  s1[j] += q1 * kd[BS + j];
                  s2[j] += q2 * kd[2 * BS + j];
                  s3[j] += q3 * kd[3 * BS + j];
                }
              }
              A* dst = scores.data() + r * Lp + blk * BS + j0;
              _Pragma("omp simd")
              for (int64_t j = 0; j < kLanes; ++j) dst[j] = (s0[j] + s1[j]) + (s2[j] + s3[j]);
            }
          }
        }
        softmax_rows(scores.data(), limit.data(), rows, Lp, inv_sum.data());
        // Output: acc[r] += sum_j p[r, j] V[j], a block of values at a time, 16 dims per register.
        for (int64_t blk = 0; blk < nblocks; ++blk) {
          const scalar_t* vb = vc + (table[blk] * BS * Hkv + kh) * D;
          if (blk + kPrefetchBlocks < nblocks) {
            const scalar_t* next = vc + (table[blk + kPrefetchBlocks] * BS * Hkv + kh) * D;
            for (int64_t j = 0; j < BS; ++j) prefetch_lines(next + j * Hkv * D, D * sizeof(scalar_t));
          }
          for (int64_t j = 0; j < BS; ++j) to_acc(vb + j * Hkv * D, tile.data() + j * D, D);
          for (int64_t r = 0; r < rows; ++r) {
            const A* pr = scores.data() + r * Lp + blk * BS;
            A* ar = acc.data() + r * D;
            // 64 head dims at a time in four register accumulators (four independent FMA chains), keys inner.
            int64_t d0 = 0;
            for (; d0 + 4 * kLanes <= D; d0 += 4 * kLanes) {
              A a0[kLanes], a1[kLanes], a2[kLanes], a3[kLanes];
              std::memcpy(a0, ar + d0, sizeof(a0));
              std::memcpy(a1, ar + d0 + kLanes, sizeof(a1));
              std::memcpy(a2, ar + d0 + 2 * kLanes, sizeof(a2));
              std::memcpy(a3, ar + d0 + 3 * kLanes, sizeof(a3));
              for (int64_t j = 0; j < BS; ++j) {
                const A p = pr[j];
                const A* vj = tile.data() + j * D + d0;
                _Pragma("omp simd")
                for (int64_t l = 0; l < kLanes; ++l) {
                  a0[l] += p * vj[l];
                  a1[l] += p * vj[kLanes + l];
                  a2[l] += p * vj[2 * kLanes + l];
                  a3[l] += p * vj[3 * kLanes + l];
                }
              }
              std::memcpy(ar + d0, a0, sizeof(a0));
              std::memcpy(ar + d0 + kLanes, a1, sizeof(a1));
              std::memcpy(ar + d0 + 2 * kLanes, a2, sizeof(a2));
              std::memcpy(ar + d0 + 3 * kLanes, a3, sizeof(a3));
            }
            for (; d0 < D; d0 += kLanes) {
              A a[kLanes];
              std::memcpy(a, ar + d0, sizeof(a));
              for (int64_t j = 0; j < BS; ++j) {
                const A p = pr[j];
                const A* vj = tile.data() + j * D + d0;
                _Pragma("omp simd")
                for (int64_t l = 0; l < kLanes; ++l) a[l] += p * vj[l];
              }
              std::memcpy(ar + d0, a, sizeof(a));
            }
          }
        }
        for (int64_t i = 0; i < qn; ++i) {
          for (int64_t g = 0; g < G; ++g) {
            const int64_t r = i * G + g;
            scalar_t* dst = op + (q0 + i) * H * D + (kh * G + g) * D;
            for (int64_t d = 0; d < D; ++d) dst[d] = st<scalar_t>(acc[r * D + d] * inv_sum[r]);
          }
        }
      }
    });
  });
  return out;
}

// out[t] = silu(gate[t]) * up[t] for gate_up = [gate | up] of width 2n, rounded where transformers rounds (silu's
// result to T, then the product). One pass and one allocation instead of eager PyTorch's two ops over strided halves.
at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "gate_up");
  const int64_t n2 = gate_up.size(-1), n = n2 / 2, rows = gate_up.numel() / n2;
  TORCH_CHECK(n2 % 2 == 0, "gate_up must have an even last dimension");
  auto sizes = gate_up.sizes().vec();
  sizes.back() = n;
  auto out = at::empty(sizes, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_mul", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* xp = gate_up.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const scalar_t* g = xp + r * n2;
        const scalar_t* u = g + n;
        scalar_t* o = op + r * n;
        _Pragma("omp simd")
        for (int64_t i = 0; i < n; ++i) {
          const A v = ld(g[i]);
          const A t = exp_nonpos(-std::abs(v));  // sigmoid(v) = 1 / (1 + e^-v), from e^-|v| to stay in range
          const A sig = (v >= A(0) ? A(1) : t) / (A(1) + t);
          o[i] = st<scalar_t>(ld(st<scalar_t>(v * sig)) * ld(u[i]));
        }
      }
    });
  });
  return out;
}

// Row-wise argmax (first index of the maximum), as torch.argmax, which is slow on the CPU: a vectorised max, then a
// scan for its first occurrence.
at::Tensor argmax_rows(const at::Tensor& x) {
  check_rows(x, "x");
  const int64_t V = x.size(-1), rows = x.numel() / V;
  auto out = at::empty({rows}, x.options().dtype(at::kLong));
  int64_t* op = out.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "argmax_rows", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const scalar_t* row = xp + r * V;
        A m = ld(row[0]);
        _Pragma("omp simd reduction(max : m)")
        for (int64_t i = 0; i < V; ++i) m = std::max(m, ld(row[i]));
        int64_t idx = 0;
        while (idx < V && ld(row[idx]) != m) ++idx;
        op[r] = idx < V ? idx : 0;  // all-NaN rows
      }
    });
  });
  return out;
}

// u[b] += e[b] @ W2^T for the drafter's Markov head: u [B, V] float32 logits (updated in place), e [B, R] and
// w2c (W2^T [R, V] packed by engine.ops.lowrank_chunks) in the model dtype. A low-rank [1, R] x [R, V] product per
// draft position is a poor fit for a GEMM library at batch 1. A work item is one chunk for up to 4 rows.
void add_lowrank_(at::Tensor& u, const at::Tensor& e, const at::Tensor& w2c) {
  check_rows(u, "u");
  check_rows(e, "e");
  TORCH_CHECK(u.scalar_type() == at::kFloat, "u must be float32");
  const int64_t B = u.size(0), V = u.size(1), R = e.size(1);
  check_lowrank_chunks(w2c, R, V);
  constexpr int64_t kChunk = kLowrankChunk;
  float* up = u.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, e.scalar_type(), "add_lowrank_", [&] {
    const scalar_t* ep = e.data_ptr<scalar_t>();
    const scalar_t* wp = w2c.data_ptr<scalar_t>();
    at::parallel_for(0, w2c.size(0) * lowrank_groups(B), 4, [&](int64_t begin, int64_t end) {
      for (int64_t w = begin; w < end; ++w) {
        float acc[kLowrankRows][kLowrankChunk];
        const auto it = lowrank_item(w, B, R, wp, [&](int64_t b) { return ep + b * R; }, acc);
        const int64_t v0 = it.c * kChunk, n = std::min(kChunk, V - v0);
        for (int64_t i = 0; i < it.nb; ++i) {
          float* out = up + (it.b0 + i) * V + v0;
          for (int64_t j = 0; j < n; ++j) out[j] += acc[i][j];
        }
      }
    });
  });
}

// Greedy left-to-right Markov decoding of the drafter's blocks at small batch (DSparkDrafter.decode): for block
// position k = 0..G-1 and every sequence b, u[k, b] += W1[prev_b] @ W2^T (in place, the arithmetic of add_lowrank_),
// x = argmax u[k, b] (the first index of the maximum, as argmax_rows), prev_b = draft_vocab[x]. One call in place of
// about ten small ops per position. u [G, B, V] float32; w1 [vocab, R] and w2c (lowrank_chunks) in the model dtype;
// anchors [B] int64 target ids (prev at k = 0); draft_vocab [V] int64 (empty: the identity). Returns (x [B, G] draft
// indices, prev [B, G] the target id each position was conditioned on).
std::tuple<at::Tensor, at::Tensor> markov_greedy(at::Tensor& u, const at::Tensor& w1, const at::Tensor& w2c,
                                                  const at::Tensor& anchors, const at::Tensor& draft_vocab) {
  check_rows(u, "u");
  check_rows(w1, "w1");
  check_rows(anchors, "anchors");
  TORCH_CHECK(u.scalar_type() == at::kFloat && u.dim() == 3, "u must be float32 [G, B, V]");
  const int64_t G = u.size(0), B = u.size(1), V = u.size(2), R = w1.size(1);
  check_lowrank_chunks(w2c, R, V);
  TORCH_CHECK(draft_vocab.numel() == 0 || draft_vocab.numel() == V, "draft_vocab must be empty or [V]");
  constexpr int64_t kChunk = kLowrankChunk;
  const int64_t chunks = w2c.size(0);
  auto local = at::empty({B, G}, anchors.options());
  auto prev_all = at::empty({B, G}, anchors.options());
  int64_t* lp = local.data_ptr<int64_t>();
  int64_t* pp = prev_all.data_ptr<int64_t>();
  const int64_t* dv = draft_vocab.numel() ? draft_vocab.data_ptr<int64_t>() : nullptr;
  std::vector<int64_t> prev(anchors.data_ptr<int64_t>(), anchors.data_ptr<int64_t>() + B);
  std::vector<float> cmax(B * chunks);
  std::vector<int64_t> cidx(B * chunks);
  float* up = u.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, w1.scalar_type(), "markov_greedy", [&] {
    const scalar_t* w1p = w1.data_ptr<scalar_t>();
    const scalar_t* wp = w2c.data_ptr<scalar_t>();
    for (int64_t k = 0; k < G; ++k) {
      float* uk = up + k * B * V;
      at::parallel_for(0, chunks * lowrank_groups(B), 4, [&](int64_t begin, int64_t end) {
        for (int64_t w = begin; w < end; ++w) {
          float acc[kLowrankRows][kLowrankChunk];
          const auto it = lowrank_item(w, B, R, wp, [&](int64_t b) { return w1p + prev[b] * R; }, acc);
          const int64_t c = it.c, v0 = c * kChunk, n = std::min(kChunk, V - v0);
          for (int64_t i = 0; i < it.nb; ++i) {
            float* out = uk + (it.b0 + i) * V + v0;
            float m = -std::numeric_limits<float>::infinity();
            _Pragma("omp simd reduction(max : m)")
            for (int64_t j = 0; j < n; ++j) {
              out[j] += acc[i][j];
              m = std::max(m, out[j]);  // NaN never wins: std::max keeps m
            }
            int64_t idx = 0;
            while (idx < n && out[idx] != m) ++idx;  // the first index of the maximum
            const int64_t b = it.b0 + i;
            cmax[b * chunks + c] = m;
            cidx[b * chunks + c] = m == -std::numeric_limits<float>::infinity() ? -1 : v0 + idx;  // as a strict >
          }
        }
      });
      for (int64_t b = 0; b < B; ++b) {
        float m = -std::numeric_limits<float>::infinity();
        int64_t idx = -1;
        for (int64_t c = 0; c < chunks; ++c)
          if (cidx[b * chunks + c] >= 0 && (idx < 0 || cmax[b * chunks + c] > m))
            m = cmax[b * chunks + c], idx = cidx[b * chunks + c];
        if (idx < 0) idx = 0;  // all-NaN row, as argmax_rows
        lp[b * G + k] = idx;
        pp[b * G + k] = prev[b];
        prev[b] = dv ? dv[idx] : idx;
      }
    }
  });
  return {local, prev_all};
}

#if defined(DSPARK_REGISTER_BLOCKED)
namespace {
inline float hsum(vreg v) {
  alignas(64) float f[Vec::lanes];
  Vec::store(f, v);
  float s = 0.0f;
  for (int64_t l = 0; l < Vec::lanes; ++l) s += f[l];
  return s;
}

// A weight stored as 8-bit integers with one scale per 32 consecutive values of a row (GGUF's Q8_0 layout), whose
// values are d * q: exact in fp32 (an fp16 scale times an int8 has at most 19 significant bits), so a dot product over
// it rounds exactly as one over the fp32 weight it came from, from a quarter of the bytes.
struct Q8Weight {
  const int8_t* q;  // [N, K]
  const float* d;   // [N, K / 32]
};
constexpr int64_t kQ8Block = 32;

// A bf16 weight [N, K] stored in tiles of 8 rows x 32 columns, [N / 8, K / 32, 8, 32]: each group of 8 rows is one
// contiguous run of 8 * K values, which the kernels below read front to back. In the plain layout a pass over NJ rows
// reads NJ interleaved streams of K values, which memory slow to answer scattered requests serves well below its
// sequential bandwidth; the tiles read at close to it. Same values and the same order of operations: the same bits
// as over the plain weight.
struct TiledBF16 {
  const c10::BFloat16* t;
};

// One weight row's vectors, widened to fp32: at(kt, kk) holds columns kt + kk .. + lanes, kt a multiple of
// kTileCols and kk below it. rows_dot walks a row a run of kTileCols columns at a time from one base pointer (in the
// tiled layout a row's runs are kTileRows * kTileCols apart), so a load needs no index arithmetic of its own.
// prefetch(k) requests the cache line of column k into L2, not L1: faster on the AVX-512 host of linear_bf16's L2
// requests (below), the same on AVX2 (a prefetch never faults, even past the end). Tiles are read in address order,
// which the hardware prefetcher follows unaided (software prefetches there measured slower, into L1 and L2 alike).
template <typename W>
struct WeightRow {
  static constexpr int64_t bytes = sizeof(W);
  const W* p;
  WeightRow() = default;
  WeightRow(const W* w, int64_t row, int64_t K) : p(w + row * K) {}
  vreg at(int64_t kt, int64_t kk) const { return Vec::load(p + kt + kk); }
  void prefetch(int64_t k) const { _mm_prefetch(reinterpret_cast<const char*>(p + k), _MM_HINT_T1); }
};
template <>
struct WeightRow<Q8Weight> {
  static constexpr int64_t bytes = 1;
  const int8_t* q;
  const float* d;
  WeightRow() = default;
  WeightRow(const Q8Weight* w, int64_t row, int64_t K) : q(w->q + row * K), d(w->d + row * (K / kQ8Block)) {}
  vreg at(int64_t kt, int64_t kk) const {
    return Vec::mul(Vec::load(q + kt + kk), Vec::set1(d[(kt + kk) / kQ8Block]));
  }
  void prefetch(int64_t k) const { _mm_prefetch(reinterpret_cast<const char*>(q + k), _MM_HINT_T1); }
};
template <>
struct WeightRow<TiledBF16> {
  static constexpr int64_t bytes = 2;
  const c10::BFloat16* p;
  WeightRow() = default;
  WeightRow(const TiledBF16* w, int64_t row, int64_t K)
      : p(w->t + (row / kTileRows) * kTileRows * K + (row % kTileRows) * kTileCols) {}
  vreg at(int64_t kt, int64_t kk) const { return Vec::load(p + kt * kTileRows + kk); }
  void prefetch(int64_t) const {}
};

// y[m, j0 .. j0 + NJ) for M rows of x against NJ weight rows: every weight vector is loaded once for all M rows, and
// the M x NJ sums stay in registers over the whole of K, as independent FMA chains. Lane l of a sum takes columns
// l, l + lanes, l + 2 lanes, ... in order and the lanes are summed in order: one reduction order per output, whatever
// M, NJ or the caller's blocking (linear_small's rows are batch-invariant). Each cache line of the weight rows two
// passes ahead is prefetched: NJ interleaved row streams of 1-3 KB each are too short for the hardware prefetcher;
// with the prefetch, fp32 at 5-8 rows went from level with oneDNN to ahead of it.
template <int M, int NJ, typename T, typename W>
inline void rows_dot(const T* x, const W* w, const T* bias, T* y, int64_t K, int64_t N, int64_t j0) {
  using Row = WeightRow<W>;
  vreg acc[M][NJ];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NJ; ++j) acc[m][j] = Vec::zero();
  Row wr[NJ], ahead[NJ];
  for (int j = 0; j < NJ; ++j) wr[j] = Row(w, j0 + j, K), ahead[j] = Row(w, j0 + 2 * NJ + j, K);
  auto step = [&](int64_t kt, int64_t kk) {
    vreg wv[NJ];
    for (int j = 0; j < NJ; ++j) wv[j] = wr[j].at(kt, kk);
    if ((((kt + kk) * Row::bytes) & 63) == 0)
      for (int j = 0; j < NJ; ++j) ahead[j].prefetch(kt + kk);
    for (int m = 0; m < M; ++m) {
      const vreg xv = Vec::load(x + m * K + kt + kk);
      for (int j = 0; j < NJ; ++j) acc[m][j] = Vec::fma(xv, wv[j], acc[m][j]);
    }
  };
  int64_t kt = 0;
  for (; kt + kTileCols <= K; kt += kTileCols) {
#pragma GCC unroll 4
    for (int64_t kk = 0; kk < kTileCols; kk += Vec::lanes) step(kt, kk);
  }
  for (; kt < K; kt += Vec::lanes) step(kt, 0);  // K = 16 mod 32: plain weights only (the others need K % 32 == 0)
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NJ; ++j)
      y[m * N + j0 + j] = st<T>(hsum(acc[m][j]) + (bias ? ld(bias[j0 + j]) : 0.0f));
}

// Weight rows per pass of M rows of x: as many as the registers hold beside the M x NJ accumulators.
template <int M>
constexpr int rows_per_pass() {
  return Vec::lanes == 16 ? (M <= 2 ? 8 : M <= 4 ? 4 : 2) : (M <= 2 ? 4 : M <= 4 ? 2 : 1);
}

template <int M, typename T, typename W>
void linear_rows(const T* x, const W* w, const T* bias, T* y, int64_t K, int64_t N) {
  if constexpr (M <= 4) {
    constexpr int NJ = rows_per_pass<M>();
    at::parallel_for(0, N / NJ, 64, [&](int64_t b, int64_t e) {
      for (int64_t g = b; g < e; ++g) rows_dot<M, NJ>(x, w, bias, y, K, N, g * NJ);
    });
    for (int64_t j = N / NJ * NJ; j < N; ++j) rows_dot<M, 1>(x, w, bias, y, K, N, j);
  } else {
    // Rows 0-3 of x, then the rest, over each chunk of weight rows: the chunk comes from memory once and from L2 the
    // second time, and each pass keeps several weight rows in registers (with all M rows at once the registers hold
    // one, and on AVX2 7 rows then ran well below the weight throughput of 4). Every output is the same dot product,
    // to the bit.
    constexpr int NA = rows_per_pass<4>(), NB = rows_per_pass<M - 4>();
    constexpr int64_t chunk = 32;  // weight rows: 72 KB of fp32 at K = 576, a multiple of NA and NB
    at::parallel_for(0, N / chunk, 2, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        for (int64_t j = c * chunk; j < (c + 1) * chunk; j += NA) rows_dot<4, NA>(x, w, bias, y, K, N, j);
        for (int64_t j = c * chunk; j < (c + 1) * chunk; j += NB)
          rows_dot<M - 4, NB>(x + 4 * K, w, bias, y + 4 * N, K, N, j);
      }
    });
    for (int64_t j = N / chunk * chunk; j < N; ++j) {
      rows_dot<4, 1>(x, w, bias, y, K, N, j);
      rows_dot<M - 4, 1>(x + 4 * K, w, bias, y + 4 * N, K, N, j);
    }
  }
}

// rows_dot over R (1 to 4) rows known only at run time, each with as many weight rows a pass as registers allow.
template <typename T, typename W>
inline void rows_dot_any(int64_t R, const T* x, const W* w, const T* bias, T* y, int64_t K, int64_t N, int64_t j0,
                         int64_t j1) {
  auto run = [&](auto r) {
    constexpr int kR = decltype(r)::value, NJ = rows_per_pass<kR>();
    int64_t j = j0;
    for (; j + NJ <= j1; j += NJ) rows_dot<kR, NJ>(x, w, bias, y, K, N, j);
    for (; j < j1; ++j) rows_dot<kR, 1>(x, w, bias, y, K, N, j);
  };
  switch (R) {
    case 4: run(std::integral_constant<int, 4>()); break;
    case 3: run(std::integral_constant<int, 3>()); break;
    case 2: run(std::integral_constant<int, 2>()); break;
    default: run(std::integral_constant<int, 1>()); break;
  }
}

// More than 8 rows: the same dot products (so a row gets the same bits whatever M is), cache-blocked as a GEMM is: a
// block of weight rows (the threads split these) comes from memory once and from cache for every group of 4 rows of
// x, a block of x rows at a time. linear_rows streams the whole weight from memory for every 8 rows: memory-bound
// from 16 rows on. A group takes as many weight rows a pass as the registers hold beside its accumulators.
template <typename T, typename W>
void linear_rows_blocked(int64_t M, const T* x, const W* w, const T* bias, T* y, int64_t K, int64_t N) {
  constexpr int NJ = rows_per_pass<4>();  // 4 x NJ sums: more measured slower on AVX2 (registers spill)
  constexpr int64_t kWeightRows = 32, kXRows = 64;
  const int64_t chunks = (N + kWeightRows - 1) / kWeightRows;
  for (int64_t m0 = 0; m0 < M; m0 += kXRows) {
    const int64_t m1 = std::min(M, m0 + kXRows);
    at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const int64_t j0 = c * kWeightRows, j1 = std::min(N, j0 + kWeightRows);
        int64_t m = m0;
        for (; m + 4 <= m1; m += 4) {
          int64_t j = j0;
          for (; j + NJ <= j1; j += NJ) rows_dot<4, NJ>(x + m * K, w, bias, y + m * N, K, N, j);
          for (; j < j1; ++j) rows_dot<4, 1>(x + m * K, w, bias, y + m * N, K, N, j);
        }
        auto tail = [&](auto r) {  // the last 1-3 rows
          constexpr int R = decltype(r)::value, NR = rows_per_pass<R>();
          int64_t j = j0;
          for (; j + NR <= j1; j += NR) rows_dot<R, NR>(x + m * K, w, bias, y + m * N, K, N, j);
          for (; j < j1; ++j) rows_dot<R, 1>(x + m * K, w, bias, y + m * N, K, N, j);
        };
        switch (m1 - m) {
          case 3: tail(std::integral_constant<int, 3>()); break;
          case 2: tail(std::integral_constant<int, 2>()); break;
          case 1: tail(std::integral_constant<int, 1>()); break;
        }
      }
    });
  }
}

// linear_rows for a row count known only at run time.
template <typename T, typename W>
void linear_rows_any(int64_t M, const T* x, const W* w, const T* bias, T* y, int64_t K, int64_t N) {
  if (M > 8) return linear_rows_blocked(M, x, w, bias, y, K, N);
  switch (M) {
    case 1: linear_rows<1>(x, w, bias, y, K, N); break;
    case 2: linear_rows<2>(x, w, bias, y, K, N); break;
    case 3: linear_rows<3>(x, w, bias, y, K, N); break;
    case 4: linear_rows<4>(x, w, bias, y, K, N); break;
    case 5: linear_rows<5>(x, w, bias, y, K, N); break;
    case 6: linear_rows<6>(x, w, bias, y, K, N); break;
    case 7: linear_rows<7>(x, w, bias, y, K, N); break;
    default: linear_rows<8>(x, w, bias, y, K, N); break;
  }
}
}  // namespace
#endif

// y = x w^T + b, made for a few rows of x (a decode step, a short verify segment, a draft block): x [M, K], w [N, K]
// row-major, K a multiple of 16, fp32 or bf16 (accumulated in fp32); w may be bf16 under fp32 x (widened
// on load, exact: half the bytes for weights that bf16 holds exactly). Memory-bound up to 8 rows: the weights stream
// once, split across the threads, each weight vector used for every row of x. Any number of rows is taken, each row
// computed to the same bits whatever the others (engine.model.Linear's batch-invariant mode runs every row count
// here). Only where the register-blocked code is built (has_linear_small).
at::Tensor linear_small(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  check_rows(x, "x");
  const WeightShape ws = weight_shape(w, "linear_small");
  TORCH_CHECK((x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                  (w.scalar_type() == x.scalar_type() || w.scalar_type() == at::kBFloat16),
              "linear_small: x float32 or bfloat16, w the same or bfloat16");
  TORCH_CHECK(!bias || bias->scalar_type() == x.scalar_type(), "linear_small: bias must have x's dtype");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == ws.K && ws.K % 16 == 0,
              "linear_small: x [M, K] and w [N, K] with K a multiple of 16");
  TORCH_CHECK(x.size(0) >= 1, "linear_small: at least one row");
  const int64_t M = x.size(0), K = ws.K, N = ws.N;
  auto y = at::empty({M, N}, x.options());
#if defined(DSPARK_REGISTER_BLOCKED)
  auto run = [&](auto* xp, const auto* wp) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(xp)>>;
    linear_rows_any(M, xp, wp, bias ? bias->data_ptr<T>() : nullptr, y.data_ptr<T>(), K, N);
  };
  auto run_x = [&](const auto* wp) {
    if (x.scalar_type() == at::kBFloat16)
      run(x.data_ptr<c10::BFloat16>(), wp);
    else
      run(x.data_ptr<float>(), wp);
  };
  if (ws.tiled) {
    const TiledBF16 tiles{w.data_ptr<c10::BFloat16>()};
    run_x(&tiles);
  } else if (w.scalar_type() == at::kBFloat16) {
    run_x(w.data_ptr<c10::BFloat16>());
  } else {
    run(x.data_ptr<float>(), w.data_ptr<float>());
  }
#else
  TORCH_CHECK(false, "linear_small needs AVX2 + FMA or AVX-512");
#endif
  return y;
}

// linear_small over a Q8Weight (q int8 [N, K], d float32 [N, K / 32]) for fp32 x: the same result to the bit as
// linear_small over the fp32 weight d * q, which it never materialises.
at::Tensor linear_small_q8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                           const c10::optional<at::Tensor>& bias) {
  check_rows(x, "x");
  check_rows(q, "q");
  check_rows(d, "d");
  TORCH_CHECK(x.scalar_type() == at::kFloat && q.scalar_type() == at::kChar && d.scalar_type() == at::kFloat,
              "linear_small_q8: x float32, q int8, d float32");
  TORCH_CHECK(!bias || bias->scalar_type() == at::kFloat, "linear_small_q8: bias must be float32");
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && x.size(1) == q.size(1) && q.size(1) % kQ8Block == 0 &&
                  d.dim() == 2 && d.size(0) == q.size(0) && d.size(1) == q.size(1) / kQ8Block,
              "linear_small_q8: x [M, K], q [N, K], d [N, K / 32] with K a multiple of 32");
  TORCH_CHECK(x.size(0) >= 1, "linear_small_q8: at least one row");
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  auto y = at::empty({M, N}, x.options());
#if defined(DSPARK_REGISTER_BLOCKED)
  const Q8Weight w{q.data_ptr<int8_t>(), d.data_ptr<float>()};
  linear_rows_any(M, x.data_ptr<float>(), &w, bias ? bias->data_ptr<float>() : nullptr, y.data_ptr<float>(), K, N);
#else
  TORCH_CHECK(false, "linear_small_q8 needs AVX2 + FMA or AVX-512");
#endif
  return y;
}

// The batch-invariant linear (engine.model.Linear(invariant=True)):
// y[m, n] = fma(x[m, K-1], w[n, K-1], ... fma(x[m, 0], w[n, 0], 0)) + bias[n], one FMA chain over k in order for
// every output, whatever M is or how the rows are grouped (a GEMM's outer-product order, so no horizontal sums); a
// platform changes the vector width (a panel is one zmm or two ymm), not the order. The weight is held in panels of
// 16 outputs, [N / 16, K, 16]: at each k the 16 outputs' weights lie side by side. A panel may hold fp32, bf16
// (exact values widened on load) or Q8_0 (int8 [N / 16, K, 16] and fp32 scales [N / 16, K / 32, 16], exact
// products): the same values in any of them give the same bits, so the engine reads compact panels where memory
// binds (a few rows) and fp32 ones where FMAs do.
#if defined(DSPARK_REGISTER_BLOCKED)
namespace {
constexpr int64_t kPanel = 16;
constexpr int kPanelVecs = kPanel / Vec::lanes;

template <typename W>
struct PanelRef {  // fp32 or bf16 panels
  const W* w;
  int64_t K;
  vreg at(int64_t p, int64_t k, int v) const { return Vec::load(w + (p * K + k) * kPanel + v * Vec::lanes); }
};
struct Q8Panels {
  const int8_t* q;
  const float* d;
};
template <>
struct PanelRef<Q8Panels> {
  Q8Panels w;
  int64_t K;
  vreg at(int64_t p, int64_t k, int v) const {
    const int64_t off = (p * K + k) * kPanel + v * Vec::lanes;
    const float* d = w.d + (p * (K / kQ8Block) + k / kQ8Block) * kPanel + v * Vec::lanes;
    return Vec::mul(Vec::load(w.q + off), Vec::load(d));
  }
};

// MR rows of x against P panels: MR x P * kPanelVecs accumulators in registers over the whole of K.
template <int MR, int P, typename T, typename W>
inline void panel_tile(const T* x, const PanelRef<W>& w, const T* bias, T* y, int64_t K, int64_t N, int64_t p0) {
  constexpr int NV = P * kPanelVecs;
  vreg acc[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int i = 0; i < NV; ++i) acc[m][i] = Vec::zero();
  for (int64_t k = 0; k < K; ++k) {
    vreg wv[NV];
    for (int i = 0; i < NV; ++i) wv[i] = w.at(p0 + i / kPanelVecs, k, i % kPanelVecs);
    for (int m = 0; m < MR; ++m) {
      const vreg xb = Vec::set1(ld(x[m * K + k]));
      for (int i = 0; i < NV; ++i) acc[m][i] = Vec::fma(xb, wv[i], acc[m][i]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int i = 0; i < NV; ++i) {
      const int64_t n = p0 * kPanel + i * Vec::lanes;
      vreg out = acc[m][i];
      if (bias) {
        alignas(64) float b[Vec::lanes];
        for (int64_t l = 0; l < Vec::lanes; ++l) b[l] = ld(bias[n + l]);
        out = Vec::add(out, Vec::load(b));
      }
      Vec::store(y + m * N + n, out);
    }
}

// Rows in groups as the registers allow: 6 rows a panel (12 accumulators on AVX2), fewer rows over more panels.
template <typename T, typename W>
void linear_panels_rows(int64_t M, const T* x, const PanelRef<W>& w, const T* bias, T* y, int64_t K, int64_t N) {
  const int64_t panels = N / kPanel;
  constexpr int64_t kChunk = 4;  // panels a work item: 4 x 16 outputs, read from memory once for every row group
  at::parallel_for(0, (panels + kChunk - 1) / kChunk, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t p0 = c * kChunk, p1 = std::min(panels, p0 + kChunk);
      auto rows = [&](auto mr, auto pp, int64_t m) {  // MR rows from m over panels p0 .. p1, PP at a time
        constexpr int MR = decltype(mr)::value, PP = decltype(pp)::value;
        int64_t p = p0;
        for (; p + PP <= p1; p += PP) panel_tile<MR, PP>(x + m * K, w, bias, y + m * N, K, N, p);
        for (; p < p1; ++p) panel_tile<MR, 1>(x + m * K, w, bias, y + m * N, K, N, p);
      };
      using I = std::integral_constant<int, 1>;
      int64_t m = 0;
      for (; M - m >= 6; m += 6) rows(std::integral_constant<int, 6>(), I(), m);
      switch (M - m) {
        case 5: rows(std::integral_constant<int, 5>(), I(), m); break;
        case 4: rows(std::integral_constant<int, 4>(), I(), m); break;
        case 3: rows(std::integral_constant<int, 3>(), I(), m); break;
        case 2: rows(std::integral_constant<int, 2>(), std::integral_constant<int, 2>(), m); break;
        case 1: rows(I(), std::integral_constant<int, kPanelVecs == 2 ? 3 : 4>(), m); break;
      }
    }
  });
}
}  // namespace
#endif

// y = x w^T + b by the batch-invariant kernel above. x [M, K] fp32 or bf16; panels [N / 16, K, 16] fp32, bf16, or
// int8 with q8_scales [N / 16, K / 32, 16] fp32; bias [N] in x's dtype. Returns [M, N].
at::Tensor linear_panels(const at::Tensor& x, const at::Tensor& panels, const c10::optional<at::Tensor>& q8_scales,
                         const c10::optional<at::Tensor>& bias) {
  check_rows(x, "x");
  check_rows(panels, "panels");
  TORCH_CHECK(x.dim() == 2 && panels.dim() == 3 && panels.size(1) == x.size(1) && panels.size(2) == 16,
              "linear_panels: x [M, K] and panels [N / 16, K, 16]");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "linear_panels: x fp32 or bf16");
  TORCH_CHECK(!bias || (bias->scalar_type() == x.scalar_type() && bias->numel() == panels.size(0) * 16),
              "linear_panels: bias [N] in x's dtype");
  const bool q8 = panels.scalar_type() == at::kChar;
  TORCH_CHECK(!q8 || (q8_scales && q8_scales->scalar_type() == at::kFloat && x.size(1) % 32 == 0 &&
                      q8_scales->numel() == panels.size(0) * (x.size(1) / 32) * 16),
              "linear_panels: int8 panels need q8_scales [N / 16, K / 32, 16] fp32 and K a multiple of 32");
  const int64_t M = x.size(0), K = x.size(1), N = panels.size(0) * 16;
  if (x.scalar_type() == at::kBFloat16 && M > 8) {
    // Widened once, x is broadcast from fp32 (a bf16 broadcast is a scalar load, shift and move for each row and k,
    // which at many rows costs more than the FMAs). Exact: the same sums, rounded to bf16 once (nearest even) as
    // below, so the same bits.
    const auto b32 = bias ? c10::optional<at::Tensor>(bias->to(at::kFloat)) : c10::nullopt;
    return linear_panels(x.to(at::kFloat), panels, q8_scales, b32).to(at::kBFloat16);
  }
  auto y = at::empty({M, N}, x.options());
#if defined(DSPARK_REGISTER_BLOCKED)
  auto run = [&](auto* xp, const auto& ref) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(xp)>>;
    linear_panels_rows(M, xp, ref, bias ? bias->data_ptr<T>() : nullptr, y.data_ptr<T>(), K, N);
  };
  auto run_x = [&](const auto& ref) {
    if (x.scalar_type() == at::kBFloat16)
      run(x.data_ptr<c10::BFloat16>(), ref);
    else
      run(x.data_ptr<float>(), ref);
  };
  if (q8)
    run_x(PanelRef<Q8Panels>{{panels.data_ptr<int8_t>(), q8_scales->data_ptr<float>()}, K});
  else if (panels.scalar_type() == at::kBFloat16)
    run_x(PanelRef<c10::BFloat16>{panels.data_ptr<c10::BFloat16>(), K});
  else
    run_x(PanelRef<float>{panels.data_ptr<float>(), K});
#else
  TORCH_CHECK(false, "linear_panels needs AVX2 + FMA or AVX-512");
#endif
  return y;
}

#if defined(__AVX512BF16__)
namespace {
// y[m, j0 + j] = the lanes of acc[m][j] summed, plus the bias, rounded to bf16 once (the plain-layout kernel; the
// tiled one does the same arithmetic 8 sums at a time in store_sums8_bf16, so both give the same bits).
template <int MB, int NJ>
inline void store_sums_bf16(const __m512 (&acc)[MB][NJ], const c10::BFloat16* bias, c10::BFloat16* y, int64_t N,
                            int64_t j0) {
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NJ; ++j)
      y[m * N + j0 + j] = st<c10::BFloat16>(_mm512_reduce_add_ps(acc[m][j]) + (bias ? ld(bias[j0 + j]) : 0.0f));
}

// The lane sums of 8 accumulators at once, each added in _mm512_reduce_add_ps's order (the 256-bit halves, the
// 128-bit halves, then lanes 0+2 / 1+3, then those two), so the same bits as store_sums_bf16 for a fraction of the
// shuffles: at K = 576 the 8 separate reductions per row of x were about a fifth of the tiled kernel's time.
inline __m256 lane_sums8(const __m512 (&a)[8]) {
  __m512 t[4], u[2];
  for (int i = 0; i < 4; ++i)  // lanes 0-7: a[2i]'s halves added; 8-15: a[2i+1]'s
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 2; ++i)  // 128-bit block b: accumulator 4i + b's four partial sums
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
  const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x44), _mm512_shuffle_ps(u[0], u[1], 0xEE));
  const __m512 w = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));  // block b: lane 0 sum b, lane 2 sum 4 + b
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, w));
}

// store_sums_bf16 for 8 weight rows: the same bits (bias added in fp32, then one round to nearest even).
template <int MB>
inline void store_sums8_bf16(const __m512 (&acc)[MB][8], const c10::BFloat16* bias, c10::BFloat16* y, int64_t N,
                             int64_t j0) {
  for (int m = 0; m < MB; ++m) {
    __m256 s = lane_sums8(acc[m]);
    if (bias) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bias + j0));
      s = _mm256_add_ps(s, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16)));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + m * N + j0), (__m128i)_mm256_cvtneps_pbh(s));
  }
}

// y[m, j0 + j] for MB rows of x against NJ weight rows, bf16 both, with vdpbf16ps: one instruction multiplies 32
// bf16 pairs (exact in fp32) and adds them, two per lane, into 16 fp32 sums. The MB x NJ sums stay in registers over
// the whole of K; the weight rows two groups ahead are prefetched (each k step is one cache line of every row).
template <int MB, int NJ>
inline void rows_dot_bf16(const c10::BFloat16* x, const c10::BFloat16* w, const c10::BFloat16* bias, c10::BFloat16* y,
                          int64_t K, int64_t N, int64_t j0, bool prefetch) {
  __m512 acc[MB][NJ];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NJ; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    __m512bh wv[NJ];
    for (int j = 0; j < NJ; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(w + (j0 + j) * K + k);
    if (prefetch)
      for (int j = 0; j < NJ; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(w + (j0 + 2 * NJ + j) * K + k), _MM_HINT_T0);
    for (int m = 0; m < MB; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * K + k);
      for (int j = 0; j < NJ; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv, wv[j]);
    }
  }
  store_sums_bf16<MB, NJ>(acc, bias, y, N, j0);
}

// Row blocks of 8, then the rest: the group's NJ weight rows come from memory once and from L1 after that.
template <int NJ>
void rows_group_bf16(int64_t M, const c10::BFloat16* x, const c10::BFloat16* w, const c10::BFloat16* bias,
                     c10::BFloat16* y, int64_t K, int64_t N, int64_t j0) {
  constexpr int MB = 8;
  int64_t m = 0;
  for (; m + MB <= M; m += MB) rows_dot_bf16<MB, NJ>(x + m * K, w, bias, y + m * N, K, N, j0, m == 0);
  const bool first = m == 0;
  const c10::BFloat16* xm = x + m * K;
  c10::BFloat16* ym = y + m * N;
  switch (M - m) {
    case 1: rows_dot_bf16<1, NJ>(xm, w, bias, ym, K, N, j0, first); break;
    case 2: rows_dot_bf16<2, NJ>(xm, w, bias, ym, K, N, j0, first); break;
    case 3: rows_dot_bf16<3, NJ>(xm, w, bias, ym, K, N, j0, first); break;
    case 4: rows_dot_bf16<4, NJ>(xm, w, bias, ym, K, N, j0, first); break;
    case 5: rows_dot_bf16<5, NJ>(xm, w, bias, ym, K, N, j0, first); break;
    case 6: rows_dot_bf16<6, NJ>(xm, w, bias, ym, K, N, j0, first); break;
    case 7: rows_dot_bf16<7, NJ>(xm, w, bias, ym, K, N, j0, first); break;
    default: break;
  }
}

// rows_dot_bf16 over tiles (TiledBF16) for MB rows of x against the 8 weight rows of one run (`run`, K * 8 values):
// the same operations for each output, so the same bits. `next`, if given, is a run further on: block `part` of
// `parts` requests every parts-th line of each of its tiles, so that memory works through all of the group's blocks.
template <int MB>
inline void tile_dot_bf16(const c10::BFloat16* x, const c10::BFloat16* run, const c10::BFloat16* bias,
                          c10::BFloat16* y, int64_t K, int64_t N, int64_t j0, const c10::BFloat16* next, int part,
                          int parts) {
  __m512 acc[MB][kTileRows];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < kTileRows; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += kTileCols) {
    __m512bh xv[MB];
    for (int m = 0; m < MB; ++m) xv[m] = (__m512bh)_mm512_loadu_si512(x + m * K + k);
    const c10::BFloat16* tile = run + k * kTileRows;
    if (next)
      for (int j = part; j < kTileRows; j += parts)
        _mm_prefetch(reinterpret_cast<const char*>(next + k * kTileRows + j * kTileCols), _MM_HINT_T1);
    for (int j = 0; j < kTileRows; ++j) {
      const __m512bh w = (__m512bh)_mm512_loadu_si512(tile + j * kTileCols);
      for (int m = 0; m < MB; ++m) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv[m], w);
    }
  }
  static_assert(kTileRows == 8);
  store_sums8_bf16<MB>(acc, bias, y, N, j0);
}

// All M rows of x against run g: blocks of 3 rows (24 sums, 3 vectors of x and one of the weight in registers), the
// run from L2 for the first and from L1 for the rest. The run two ahead goes to L2 (_MM_HINT_T1): requests into L1,
// all in the first block, held the core's few L1 miss buffers and left memory idle during the later blocks (8 rows
// of x then took as long as compute plus memory; into L2 they overlap). A single block (up to 3 rows) reads the runs
// as one stream, which the hardware prefetcher follows: requests there measured slower.
void tiles_group_bf16(int64_t M, const c10::BFloat16* x, const c10::BFloat16* tiles, const c10::BFloat16* bias,
                      c10::BFloat16* y, int64_t K, int64_t N, int64_t g) {
  const c10::BFloat16* run = tiles + g * kTileRows * K;
  const c10::BFloat16* next = M > 3 && (g + 2) * kTileRows < N ? run + 2 * kTileRows * K : nullptr;
  const int64_t j0 = g * kTileRows;
  const int parts = (M + 2) / 3;
  int64_t m = 0;
  int part = 0;
  for (; m + 3 <= M; m += 3, ++part) tile_dot_bf16<3>(x + m * K, run, bias, y + m * N, K, N, j0, next, part, parts);
  if (M - m == 2) tile_dot_bf16<2>(x + m * K, run, bias, y + m * N, K, N, j0, next, part, parts);
  if (M - m == 1) tile_dot_bf16<1>(x + m * K, run, bias, y + m * N, K, N, j0, next, part, parts);
}

}  // namespace

// y = x w^T + b in bf16 for a moderate number of rows (a verify batch, a few sequences' draft blocks): x [M, K],
// w [N, K], K a multiple of 32, accumulated in fp32 by vdpbf16ps (AVX512-BF16) and rounded to bf16 once. Between
// linear_small's few rows (memory-bound, fp32 FMAs over widened weights) and a GEMM library's many: at 16 rows a
// bf16 GEMM is neither memory- nor compute-bound on a small model's skinny weights. w may be bf16 tiles
// [N / 8, K / 32, 8, 32] (TiledBF16, what Linear keeps): then each run of 8 weight rows is read once, front to back,
// for blocks of 3 rows of x (tiles_group_bf16); the same bits as over the plain weight.
at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  check_rows(x, "x");
  const WeightShape ws = weight_shape(w, "linear_bf16");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16 &&
                  (!bias || bias->scalar_type() == at::kBFloat16),
              "linear_bf16: x, w and bias must be bfloat16");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == ws.K && ws.K % 32 == 0,
              "linear_bf16: x [M, K] and w [N, K] with K a multiple of 32");
  const int64_t M = x.size(0), K = ws.K, N = ws.N;
  auto y = at::empty({M, N}, x.options());
  const auto* xp = x.data_ptr<c10::BFloat16>();
  const auto* wp = w.data_ptr<c10::BFloat16>();
  const auto* bp = bias ? bias->data_ptr<c10::BFloat16>() : nullptr;
  auto* yp = y.data_ptr<c10::BFloat16>();
  if (ws.tiled) {
    at::parallel_for(0, N / kTileRows, 4, [&](int64_t b, int64_t e) {
      for (int64_t g = b; g < e; ++g) tiles_group_bf16(M, xp, wp, bp, yp, K, N, g);
    });
    return y;
  }
  // 8 x 3 sums, 3 weight vectors and one of x: 28 of the 32 zmm registers. (Fewer rows of x with more weight rows per
  // group, 4 x 6 or 2 x 8, ran no faster at 1-2 rows and slower at 3-5.)
  constexpr int64_t NJ = 3;
  at::parallel_for(0, N / NJ, 16, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g) rows_group_bf16<NJ>(M, xp, wp, bp, yp, K, N, g * NJ);
  });
  for (int64_t j = N / NJ * NJ; j < N; ++j) rows_group_bf16<1>(M, xp, wp, bp, yp, K, N, j);
  return y;
}
#endif

// What a Linear runs at a step's row count (engine/model.py: Linear.call_args, numbered as its LINEAR_*): a kernel
// above, or oneDNN's GEMM over its prepacked weight (on x widened to fp32 and the result rounded back, where oneDNN
// packs no bf16).
enum LinearKernel : int64_t {
  kLinearSmall = 0, kLinearSmallQ8 = 1, kLinearBF16 = 2, kOneDNN = 3, kOneDNNWidened = 4, kLinearPanels = 5
};
constexpr int64_t kLayerParams = 16;  // per layer in decoder_layers' params, in engine/model.py layer_call_args' order

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                               std::string_view, c10::List<std::optional<at::Scalar>>,
                                               std::optional<std::string_view>)>();
  return op.call(x, packed, bias, "none", c10::List<std::optional<at::Scalar>>(), std::string_view(""));
}

at::Tensor run_linear(const at::Tensor& x, int64_t kind, const c10::optional<at::Tensor>& w,
                      const c10::optional<at::Tensor>& q8_scales, const c10::optional<at::Tensor>& bias) {
  switch (kind) {
    case kLinearSmallQ8: return linear_small_q8(x, *w, *q8_scales, bias);
#if defined(__AVX512BF16__)
    case kLinearBF16: return linear_bf16(x, *w, bias);
#endif
    case kOneDNN: return onednn_linear(x, *w, bias);
    case kOneDNNWidened: return onednn_linear(x.to(at::kFloat), *w, bias).to(x.scalar_type());
    case kLinearSmall: return linear_small(x, *w, bias);
    case kLinearPanels: return linear_panels(x, *w, q8_scales, bias);
  }
  TORCH_CHECK(false, "decoder_layers: linear kind ", kind, " is not built on this CPU");
}

// DecoderLM.forward's loop over the decoder layers in one call (the drafter's block_hidden_paged runs its draft layers
// through it too, causal=false), for a step where every sequence is in the attention kernel's group (decodes and
// verify segments, no prefill chunk): the same kernels and GEMMs in the same order, so the same bits, without the
// Python loop's 9 calls a layer through pybind (the GIL taken back after each). h [T, d] (the embeddings) becomes
// the last layer's output in place; the outputs of the layers in tap_layers are copied into taps
// [T, len(tap_layers) * d] in that order.
void decoder_layers(at::Tensor& h, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                    const at::Tensor& cu_q, const at::Tensor& ctx_len, const at::Tensor& block_tables,
                    const std::vector<c10::optional<at::Tensor>>& params, const std::vector<int64_t>& kinds,
                    std::vector<at::Tensor> k_caches, std::vector<at::Tensor> v_caches, int64_t num_heads,
                    int64_t num_kv_heads, double eps, double scale, bool causal,
                    const std::vector<int64_t>& tap_layers, c10::optional<at::Tensor> taps) {
  const int64_t L = static_cast<int64_t>(k_caches.size()), d = h.size(1);
  TORCH_CHECK(static_cast<int64_t>(params.size()) == L * kLayerParams && static_cast<int64_t>(kinds.size()) == 4 * L &&
                  static_cast<int64_t>(v_caches.size()) == L,
              "decoder_layers: ", kLayerParams, " params and 4 kinds per layer, one K and V cache each");
  TORCH_CHECK(tap_layers.empty() || (taps && taps->size(1) == d * static_cast<int64_t>(tap_layers.size())),
              "decoder_layers: taps must be [T, len(tap_layers) * d]");
  at::Tensor x = rms_norm(h, *params[0], eps);
  for (int64_t i = 0; i < L; ++i) {
    const auto* p = params.data() + i * kLayerParams;
    const int64_t* kind = kinds.data() + 4 * i;
    // p: input_norm, qkv (w, q8 scales, bias), q_norm, k_norm, o (3), post_norm, gate_up (3), down (3)
    at::Tensor q = rope_and_cache(run_linear(x, kind[0], p[1], p[2], p[3]), cos, sin, slots, k_caches[i],
                                  v_caches[i], num_heads, num_kv_heads, p[4], p[5], eps);
    at::Tensor o = paged_attention(q, k_caches[i], v_caches[i], cu_q, ctx_len, block_tables, scale, causal);
    x = add_rms_norm(run_linear(o, kind[1], p[6], p[7], p[8]), h, *p[9], eps);  // h += attention output
    at::Tensor mlp = run_linear(silu_mul(run_linear(x, kind[2], p[10], p[11], p[12])), kind[3], p[13], p[14], p[15]);
    if (i + 1 < L)
      x = add_rms_norm(mlp, h, *params[(i + 1) * kLayerParams], eps);  // h += MLP output
    else
      h.add_(mlp);
    for (size_t k = 0; k < tap_layers.size(); ++k)
      if (tap_layers[k] == i) taps->narrow(1, static_cast<int64_t>(k) * d, d).copy_(h);
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The GIL is released while a kernel runs (as torch's own ops do), so a server's event-loop thread can work beside
  // the engine thread instead of waiting for it and then holding it up.
  using release_gil = py::call_guard<py::gil_scoped_release>;
  m.def("rms_norm", &rms_norm, release_gil());
  m.def("add_rms_norm", &add_rms_norm, release_gil());
  m.def("argmax_rows", &argmax_rows, release_gil());
  m.def("add_lowrank_", &add_lowrank_, release_gil());
  m.def("markov_greedy", &markov_greedy, release_gil());
  m.def("rope_and_cache", &rope_and_cache, release_gil());
  m.def("paged_attention", &paged_attention, release_gil());
  m.def("silu_mul", &silu_mul, release_gil());
  m.def("linear_small", &linear_small, release_gil());
  m.def("linear_small_q8", &linear_small_q8, release_gil());
  m.def("linear_panels", &linear_panels, release_gil());
#if defined(DSPARK_REGISTER_BLOCKED)
  m.def("has_linear_small", [] { return true; });
#else
  m.def("has_linear_small", [] { return false; });
#endif
#if defined(__AVX512BF16__)
  m.def("linear_bf16", &linear_bf16, release_gil());
  m.def("has_linear_bf16", [] { return true; });
#else
  m.def("has_linear_bf16", [] { return false; });
#endif
  m.def("decoder_layers", &decoder_layers, release_gil());
  m.def("paired_keys", [] { return kPairedKeys; }, "whether bf16 K caches can use the dim-paired layout");
}
