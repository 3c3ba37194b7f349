"""The request and its rules, JAX-free: what the page, the APIs, the CLI and the engine agree on.

    errors.py            InvalidInput and the other one-sentence failures, in one module no stage depends on
    fields.py            the table of request fields: types, defaults, bounds, checks, A1111 labels
    request.py           Request, RequestRules, parse_request: every field checked once where it enters
    controlnet_units.py  ControlNet units: checked, preprocessed, weighted per step
    image_prompts.py     image prompts (IP-Adapter): checked, CLIP's preprocessing, each one's window in steps
    hires.py             the hires fix's rules: upscalers by A1111's names, sizes, A1111's step rule
    image_inputs.py      the init image and the mask: checked, decoded (guarded), fitted
    inpaint_modes.py     how a request uses its mask: whole picture, only masked, outpainting; and the overlay
    outpaint.py          outpainting: the sides' pixels, the grown canvas, its soft mask
    inpaint_crop.py      inpaint only masked: the mask's padded box at the size's ratio, cropped and scaled
    overlay.py           the result pasted back over the picture through the blurred mask (A1111's overlay)
    regions.py           regional prompts: the divide syntax or a painted mask, the parts split on BREAK
    styles.py            the style templates (assets/styles.json) and the examples
    sizes.py             the offered sizes
    sampler_names.py     A1111's sampler and schedule names <-> the engine's ids
    presets.py           the few-step recipes (assets/presets.json)
    stopping.py          StopFlag and Stopped
    parameters.py        the `parameters` text (A1111's infotext) and the status line: the one writer and reader
    image_files.py       images -> PNG and JPEG files carrying that text, and the text read back from a file
    engine.py            the `Engine` protocol: what the page reads of an engine, local or remote
    xyz_plot.py          the X/Y/Z plot: A1111's axes, value ranges and script_args -> one checked request per cell
    xyz_run.py           a plot's cells run on any engine (merged where they can share a call), Stop, its grids
    xyz_grid.py          a plot's labelled grid image (PIL), A1111-like

The engine's packages import from here; nothing here imports them, so web/ can use it without loading JAX.
"""
