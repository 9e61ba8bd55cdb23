// Gated activations h = act(gate, up), applied by the executor between gate_up and prep_inter.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "common.h"

namespace ft {

enum class Activation { silu, gelu, gelu_tanh, swigluoai, swiglu_clamp };

struct ActivationSpec {
  Activation kind = Activation::silu;
  float alpha = 1.702f;  // swigluoai: sigmoid slope
  float limit = 7.0f;    // swigluoai, swiglu_clamp: clamp bound
};

inline Activation activation_from_name(const std::string& name) {
  if (name == "silu") return Activation::silu;
  if (name == "gelu") return Activation::gelu;
  if (name == "gelu_tanh") return Activation::gelu_tanh;
  if (name == "swigluoai") return Activation::swigluoai;
  if (name == "swiglu_clamp") return Activation::swiglu_clamp;
  throw Error("activation='" + name + "' is unknown; expected one of silu, gelu, gelu_tanh, swigluoai, swiglu_clamp");
}

inline void apply_activation(const ActivationSpec& a, const float* gate, const float* up, int n, float* h) {
  switch (a.kind) {
    case Activation::silu:
      for (int i = 0; i < n; ++i) h[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
      return;
    case Activation::gelu:
      for (int i = 0; i < n; ++i) h[i] = 0.5f * gate[i] * (1.f + std::erf(gate[i] * 0.70710678118654752f)) * up[i];
      return;
    case Activation::gelu_tanh: {
      const float c = 0.79788456080286536f;  // sqrt(2 / pi)
      for (int i = 0; i < n; ++i) {
        const float g = gate[i];
        h[i] = 0.5f * g * (1.f + std::tanh(c * (g + 0.044715f * g * g * g))) * up[i];
      }
      return;
    }
    case Activation::swigluoai:
      // gpt-oss: gate clamped from above, up clamped both ways, and (up + 1) times the gated gate.
      for (int i = 0; i < n; ++i) {
        const float g = std::min(gate[i], a.limit);
        const float u = std::clamp(up[i], -a.limit, a.limit);
        h[i] = (u + 1.f) * (g / (1.f + std::exp(-a.alpha * g)));
      }
      return;
    case Activation::swiglu_clamp:
      for (int i = 0; i < n; ++i) {
        const float g = std::min(gate[i], a.limit);
        const float u = std::clamp(up[i], -a.limit, a.limit);
        h[i] = g / (1.f + std::exp(-g)) * u;
      }
      return;
  }
}

}  // namespace ft
