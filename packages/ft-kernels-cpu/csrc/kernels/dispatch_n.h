// Runtime vector count -> compile-time template argument, for the row kernels unrolled over the
// n <= MoeFormat::kMaxTokensPerCall (8) vectors of one call.
#pragma once

#include <type_traits>

namespace ft {

// Calls f(std::integral_constant<int, N>{}) for the runtime n in 1..8 (above 8 as 8): kernels
// unrolled over N vectors (MoeFormat::kMaxTokensPerCall = 8), e.g.
//   dispatch_n(n, [&](auto nv) { row_kernel<decltype(nv)::value>(w, xs, K, out, os, pf); });
template <class F>
inline void dispatch_n(int n, F&& f) {
  switch (n) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

}  // namespace ft
