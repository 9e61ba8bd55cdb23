// FT_GPU_BACKEND=none: no kernel-IO image; the kernel handshake reports itself unavailable.
#include <cstddef>
extern const unsigned char ft_kernel_image[] = {0};
extern const size_t ft_kernel_image_size = 0;
