"""What the request features cost on the served engine: LoRA sets, image inputs and the speed levers, ControlNet, the
refiner and the hires pass, live previews, the server history (parts of `python -m bench`), weighted prompts
(`python -m bench.features.prompts`), the ESRGAN upscaler's tiles (`python -m bench.features.esrgan_tiles`), image
prompts (`bench.features.image_prompt`) and union, PAG, FreeU, regions, outpainting and the plot
(`bench.features.composition`)."""
