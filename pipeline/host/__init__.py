"""The engine's host side: a run planned (planning/), its programs built (compiling/), then executed: the rows put on
the devices (placement), the LoRA sets merged, the text cache, merged calls, the denoising loop, the upscaler's
tiles."""
