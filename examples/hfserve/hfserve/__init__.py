"""hfserve: an OpenAI-compatible inference server on Hugging Face transformers (aiohttp), with a fast engine.

Modules: ``server`` (HTTP layer, command line), ``engine`` (the transformers engine and the job types both
engines share), ``loading`` (weights straight onto the device), ``fast`` (the fast engine: its model, the
own Llama forward over a preallocated KV pool; CUDA-graph decode; the scheduler; profiling), ``hfkernels``
(its Triton kernels) and ``tables`` (the kernels' launch tables per GPU, ``tables/<GPU>.json``). Run it as ``python -m hfserve ARGS``, as
the ``hfserve`` command once installed, or as ``python examples/hfserve ARGS`` from a copy of its folder.
Importing the package imports nothing heavy: torch and transformers come with its modules.
"""
