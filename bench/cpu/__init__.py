"""The engine measured on this machine's CPU: against diffusers' own pipeline (the speed guard CI runs), start-up,
recompilations, the host loop and Stop, few-step recipes, merged requests, the app's lifecycle, tracing, conversion.

`reference` times `Generator.generate` against diffusers' Flax pipeline in a worker process of the reference venv's
python (`reference_worker`, standalone); `program_times` is the per-program profile the reference part, the
accelerator part and the tests read. Parts of `python -m bench`, and `python -m bench.cpu.lifecycle`,
`python -m bench.cpu.tracing`, `python -m bench.cpu.convert`.
"""
