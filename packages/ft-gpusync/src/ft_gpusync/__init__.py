"""ft_gpusync: the GPU<->CPU handshake layer of ft.

It will connect GPU stream progress to CPU expert work: a doorbell word the GPU writes, a done word
it waits on, one pinned IO block per bridge, and a coordinator thread that calls the ft_kernels_cpu
executor through its C ABI without the GIL. Stream handles and device pointers are plain integers;
this package never imports torch.

Skeleton: there is no public API yet (it comes with issue #4).
"""

__all__: list[str] = []
__version__ = "0.1.0"
