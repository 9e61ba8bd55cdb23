// The read kernel behind MoeExecutor::read_bandwidth_gbs: the ceiling the MoE kernels are measured
// against. It streams a buffer with the widest loads of the tier and folds them into a checksum so
// that nothing can be optimised away.
#include "common.h"

namespace ft {

namespace {

uint64_t read_scalar(const uint8_t* p, size_t bytes) {
  const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= bytes / 8; i += 4) {
    a ^= q[i];
    b ^= q[i + 1];
    c ^= q[i + 2];
    d ^= q[i + 3];
  }
  return a ^ b ^ c ^ d;
}

#if FT_X86
FT_TARGET_AVX2 uint64_t read_avx2(const uint8_t* p, size_t bytes) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i + 128 <= bytes; i += 128) {
    a = _mm256_xor_si256(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_xor_si256(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_xor_si256(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
}

FT_TARGET_AVX512 uint64_t read_avx512(const uint8_t* p, size_t bytes) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (size_t i = 0; i + 256 <= bytes; i += 256) {
    a = _mm512_xor_si512(a, _mm512_load_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_load_si512(p + i + 64));
    c = _mm512_xor_si512(c, _mm512_load_si512(p + i + 128));
    d = _mm512_xor_si512(d, _mm512_load_si512(p + i + 192));
  }
  const __m512i s = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, s);
  uint64_t out = 0;
  for (uint64_t v : lanes) out ^= v;
  return out;
}
#endif

}  // namespace

// `p` is 64-byte aligned and `bytes` a multiple of 256.
uint64_t read_checksum(Isa isa, const uint8_t* p, size_t bytes) {
#if FT_X86
  switch (isa) {
    case Isa::avx512_bf16:
    case Isa::avx512:
      return read_avx512(p, bytes);
    case Isa::avx2:
      return read_avx2(p, bytes);
    case Isa::scalar:
      break;
  }
#else
  (void)isa;
#endif
  return read_scalar(p, bytes);
}

}  // namespace ft
