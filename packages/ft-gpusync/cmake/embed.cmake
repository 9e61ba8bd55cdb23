# cmake -DIN=<binary> -DOUT=<file.cpp> -DSYMBOL=<name> -P embed.cmake
# Writes a C++ file defining `extern const unsigned char SYMBOL[]` and `SYMBOL_size` with IN's bytes.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}" "// Generated from ${IN} by embed.cmake\n#include <cstddef>\n"
  "extern const unsigned char ${SYMBOL}[] = {${body}};\n"
  "extern const size_t ${SYMBOL}_size = ${bytes};\n")
