"""ft_gpusync: the GPU<->CPU handshake layer of ft.

It connects GPU stream progress to CPU expert work: a doorbell word the GPU writes, a done word it
waits on, one IO block per bridge, and a coordinator thread that calls the ft_kernels_cpu executor
through its C ABI without the GIL. Stream handles and device pointers are plain integers; this package
never imports torch.

``Bridge``: the handshake on a stream (kernel, memop or host-func, probed at start);
``Coordinator``: its CPU side alone (IO block, coordinator thread, watchdog); ``runtime_status`` and
``probe_memop_graph``: what the GPU runtime here can do.
"""

from ft_gpusync._bridge import HANDSHAKES, Bridge
from ft_gpusync._coordinator import Coordinator, CoordinatorError
from ft_gpusync._coordinator import _native as _native_module

PendingGpuError = _native_module.PendingGpuError
runtime_status = _native_module.runtime_status
probe_memop_graph = _native_module.probe_memop_graph

__all__ = [
    "HANDSHAKES",
    "Bridge",
    "Coordinator",
    "CoordinatorError",
    "PendingGpuError",
    "probe_memop_graph",
    "runtime_status",
]
__version__ = "0.1.0"
