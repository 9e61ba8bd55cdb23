"""ft_models: the model layer of ft.

It will hold the layers (attention, norms, rope, the MoE layer per strategy), the quant methods with
their GPU expert GEMMs, the model families and the checkpoint loaders (safetensors, GGUF). A model's
MoE layer supplies only the GPU expert math; ft_moe_runtime owns route splitting, scheduling and merging.

Skeleton: there is no public API yet.
"""

__all__: list[str] = []
__version__ = "0.1.0"
