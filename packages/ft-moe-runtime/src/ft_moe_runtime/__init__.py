"""ft_moe_runtime: the MoE runtime layer of ft.

It will own everything between a model's router and its expert math: the GPU expert slot cache
(LRU) with its ensure/gather Triton kernels, the hybrid decode executor that splits routes between
GPU slots and the CPU, overlaps the two and merges their partial sums, the shared-expert overlap
helper, and the bandwidth profile. Its contracts are typing.Protocols in ft_moe_runtime.interfaces.

Skeleton: there is no public API yet (the cache comes with issue #5).
"""

__all__: list[str] = []
__version__ = "0.1.0"
