"""The served programs compiled by the real TPU compiler on this host, no TPU needed: `python -m bench tpu` (every
program, its HBM, FLOPs, bytes and roofline for a topology) and `python -m bench tpu-second-pass` (the refiner and the
2048² hires pass); `cost` reads XLA's memory and cost analyses against a chip's published figures."""
