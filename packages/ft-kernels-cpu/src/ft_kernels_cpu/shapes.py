"""MoE layer shapes of public models, by preset name (used by the benchmark and the demo)."""

from __future__ import annotations

from typing import NamedTuple


class MoeShape(NamedTuple):
    hidden: int
    intermediate: int
    num_experts: int
    top_k: int
    num_layers: int
    activation: str


SHAPES: dict[str, MoeShape] = {
    "qwen3-30b-a3b": MoeShape(2048, 768, 128, 8, 48, "silu"),
    "qwen3.6-35b-a3b": MoeShape(2048, 512, 256, 8, 40, "silu"),
    "gpt-oss-120b": MoeShape(2880, 2880, 128, 4, 36, "swigluoai"),
    "gemma-4-26b-a4b": MoeShape(2816, 704, 128, 8, 30, "gelu_tanh"),
}


def get_shape(name: str) -> MoeShape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"shape={name!r} is unknown; expected one of {', '.join(SHAPES)}") from None
