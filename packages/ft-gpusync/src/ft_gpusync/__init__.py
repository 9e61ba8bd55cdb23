"""ft_gpusync: the GPU<->CPU handshake layer of ft.

It connects GPU stream progress to CPU expert work: a doorbell word the GPU writes, a done word it
waits on, one IO block per bridge, and a coordinator thread that calls the ft_kernels_cpu executor
through its C ABI without the GIL. Stream handles and device pointers are plain integers; this package
never imports torch.

Today: the CPU side (``Coordinator``: IO block, coordinator thread, watchdog). The GPU handshakes
(kernel, memop, host-func) and their probes come next (issue #4).
"""

from ft_gpusync._coordinator import Coordinator, CoordinatorError

__all__ = ["Coordinator", "CoordinatorError"]
__version__ = "0.1.0"
