"""hfserve: an OpenAI-compatible inference server on Hugging Face transformers (aiohttp), with a fast engine.

Modules: ``server`` (HTTP layer, command line), ``engine`` (the transformers engine and the job types both
engines share), ``loading`` (weights straight onto the device), ``fastengine`` (the own Llama forward over
a preallocated KV pool) and ``hfkernels`` (its Triton kernels). Run it as ``python -m hfserve ARGS``, as
the ``hfserve`` command once installed, or as ``python examples/hfserve ARGS`` from a copy of its folder.
Importing the package imports nothing heavy: torch and transformers come with its modules.
"""
