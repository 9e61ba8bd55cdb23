#include "format.h"

#include <algorithm>
#include <cstdlib>

#include <string>

namespace ft {

// Every weight format, once, by name; filled by FT_REGISTER_FORMAT in kernels/<fmt>.cpp while the
// module loads (a function-local static, so it exists before any registration runs).
static std::vector<FormatEntry>& format_table() {
  static std::vector<FormatEntry> table;
  return table;
}

bool register_format(const char* name, FormatFactory make) {
  for (const auto& f : format_table()) {
    if (std::string(f.name) == name) std::abort();  // two kernels/*.cpp claim one name: a build bug
  }
  format_table().push_back({name, make});
  return true;
}

std::vector<FormatEntry> weight_formats() {
  std::vector<FormatEntry> out = format_table();
  std::sort(out.begin(), out.end(), [](const FormatEntry& a, const FormatEntry& b) { return std::string(a.name) < b.name; });
  return out;
}

std::unique_ptr<MoeFormat> make_format(const std::string& name, const MoeParams& params, FormatArgs& args) {
  for (const auto& f : format_table()) {
    if (name == f.name) return f.make(params, args);
  }
  std::string known;
  for (const auto& f : weight_formats()) known += (known.empty() ? "" : ", ") + std::string(f.name);
  throw Error("weight_format='" + name + "' is unknown; expected one of " + known);
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::f32: return "f32";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
  }
  return "?";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::bf16:
    case DType::f16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::u8: return 1;
  }
  return 0;
}

// numpy dtype names a bank of each type may arrive as (bf16/f16 also as their uint16 bit patterns).
static bool dtype_accepts(DType dtype, const std::string& np) {
  switch (dtype) {
    case DType::bf16: return np == "bfloat16" || np == "uint16";
    case DType::f16: return np == "float16" || np == "uint16";
    case DType::f32: return np == "float32";
    case DType::u8: return np == "uint8" || np == "int8";
    case DType::i32: return np == "int32";
  }
  return false;
}

static std::string shape_str(std::initializer_list<long long> dims, DType dtype) {
  std::string s = "[";
  for (long long d : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "] " + dtype_name(dtype);
}

const void* FormatArgs::optional_bank(const std::string& name, std::initializer_list<long long> dims, DType dtype) {
  auto it = banks_.find(name);
  if (it == banks_.end()) return nullptr;
  used_banks_.insert(name);
  size_t expected = dtype_size(dtype);
  for (long long d : dims) expected *= static_cast<size_t>(d);
  const Bank& bank = it->second;
  if (!bank.dtype.empty() && !dtype_accepts(dtype, bank.dtype)) {
    throw Error(context_ + ": bank '" + name + "' has dtype " + bank.dtype + "; expected " + shape_str(dims, dtype));
  }
  if (bank.nbytes != expected) {
    throw Error(context_ + ": bank '" + name + "' has " + std::to_string(bank.nbytes) + " bytes; expected " +
                std::to_string(expected) + " bytes (" + shape_str(dims, dtype) + ")");
  }
  if (bank.data == nullptr) throw Error(context_ + ": bank '" + name + "' has a null address");
  return bank.data;
}

const void* FormatArgs::require_bank(const std::string& name, std::initializer_list<long long> dims, DType dtype) {
  if (banks_.find(name) == banks_.end()) {
    throw Error(context_ + ": missing bank '" + name + "'; expected " + shape_str(dims, dtype));
  }
  return optional_bank(name, dims, dtype);
}

double FormatArgs::require_option(const std::string& name, const std::string& meaning) {
  auto it = options_.find(name);
  if (it == options_.end()) throw Error(context_ + ": missing option '" + name + "' (" + meaning + ")");
  used_options_.insert(name);
  return it->second;
}

double FormatArgs::option_or(const std::string& name, double fallback) {
  auto it = options_.find(name);
  if (it == options_.end()) return fallback;
  used_options_.insert(name);
  return it->second;
}

void FormatArgs::check_all_used() const {
  for (const auto& kv : banks_) {
    if (!used_banks_.count(kv.first)) {
      throw Error(context_ + ": bank '" + kv.first + "' is not used by this format (misspelt?)");
    }
  }
  for (const auto& kv : options_) {
    if (!used_options_.count(kv.first)) {
      throw Error(context_ + ": option '" + kv.first + "' is not used by this format or activation");
    }
  }
}

}  // namespace ft
