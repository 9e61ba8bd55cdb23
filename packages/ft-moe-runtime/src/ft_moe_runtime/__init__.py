"""ft_moe_runtime: the MoE runtime of ft, between the native layers and the models.

Today: the GPU expert slot cache (``ExpertSlotCache``: LRU admission and hybrid capped fetch decided
on the device by a Triton kernel, proven against ``LruReference``, the pure-Python model of its
contract). To come: the gather of planned experts, the hybrid decode executor, the shared-expert
overlap helper and the bandwidth profile (issue #5 and later).
"""

from ft_moe_runtime.cache import ExpertSlotCache, FetchPolicy, LruReference

__all__ = ["ExpertSlotCache", "FetchPolicy", "LruReference"]
__version__ = "0.1.0"
