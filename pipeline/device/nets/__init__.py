"""The project's own Flax networks for SDXL: UNet, VAE, both CLIP text encoders, the ControlNet's blocks, and an
image prompt's CLIP vision encoder, IP-Adapter projections and decoupled cross-attention.

diffusers dropped its Flax classes after 0.39 and transformers dropped Flax in v5, so the engine keeps its own
linen modules, written for SDXL only. Their parameter trees are exactly those of diffusers' and transformers' Flax
classes (same module names, nesting and shapes), so every checkpoint, conversion rule, LoRA key map and cached
executable written for those keeps working; tests/engine/test_networks.py pins outputs and trees.
"""
