"""Benchmarks of the sdxl-jax engine: `python -m bench --help`.

Parts (each a module): reference (engine vs diffusers' own pipeline, which runs in a worker process with the
reference venv's python: reference_worker, reference_venv), startup (cold vs warm compilation cache),
serving (through the Gradio app, under concurrency), recompiles (random requests add no compilations), flops (the
hardware limit from XLA's cost analysis of the real SDXL), soak (sustained load; also tests/system/test_soak.py), and
report (results.json, results.md, chart.png). This package imports nothing heavy: `__main__` must configure the
JAX platform and the virtual CPU device count before JAX is first imported.
"""
