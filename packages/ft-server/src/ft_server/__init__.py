"""ft_server: the serving layer of ft, the top of the stack.

It will hold the engine (KV cache, scheduler, CUDA-graph runner, sampler), tokenizers and chat
templates, the OpenAI-compatible HTTP API and the `ft` command line (`ft serve`, `ft bench bw`,
`ft bench decode`, `ft demo`).

Skeleton: there is no public API and no console script yet.
"""

__all__: list[str] = []
__version__ = "0.1.0"
