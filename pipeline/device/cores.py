"""The UNet's attention cores by name, without JAX: the options and the config offer them before JAX loads.

What each core is and where it runs: device/attention.py.
"""

#: auto = splash on TPU, cudnn on NVIDIA bf16, xla elsewhere.
ATTENTIONS = ("auto", "xla", "splash", "cudnn", "diffusers")
