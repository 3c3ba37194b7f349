"""The served programs and how they are built: `programs.ServedPrograms` (jit of the device bodies, one per
`ProgramKey`), XLA's options, JAX's persistent cache and this host's own executables, the turns several processes take
to compile, and the ahead-of-time builds (`aot`: `python -m pipeline precompile`, `--precompiled`)."""
