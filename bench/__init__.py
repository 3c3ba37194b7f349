"""Benchmarks of the sdxl-jax engine: `python -m bench --help`, and bench/README.md for each part.

By subject: cpu/ (the engine on this CPU, against diffusers' own pipeline: the speed guard), accelerator/ (full size
on a GPU or TPU host, the hardware limit), tpu/ (programs compiled for a TPU topology here), serving/ (through the
app, the engine service, the APIs), features/ (what each request feature costs), report/ (what a run writes, and the
README's tables from bench/results/). `engine.py` is the one module that imports the engine (`pipeline`). This
package imports nothing heavy: `__main__` must configure the JAX platform and the virtual CPU device count before JAX
is first imported.
"""
