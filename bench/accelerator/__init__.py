"""The engine at full size on a GPU or TPU host: `python -m bench accelerator` (end to end, against diffusers' Flax
and PyTorch pipelines), `unet` (the UNet step per attention core), `step-profile` (the step's device time by op
category, lever sets, throughput), `gpu` (the first and third in one time budget), and the hardware limit of the
`flops` part (XLA's cost analysis of SDXL, FLOPs against published peaks).

`torch_worker` runs diffusers' PyTorch pipeline in a process of its own (standalone); `device_site` packs what a lent
GPU machine without a network needs (`python -m bench.accelerator.device_site`).
"""
