"""The generate stage's engines: the plain batched path, the compiled static-cache path, and the CUDA-graph slots."""
