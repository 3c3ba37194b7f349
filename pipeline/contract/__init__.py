"""The request and its rules, JAX-free: what the page, the APIs, the CLI and the engine agree on.

    errors.py            InvalidInput and the other one-sentence failures, in one module no stage depends on
    fields.py            the table of request fields: types, defaults, bounds, checks, A1111 labels
    request.py           Request, RequestRules, parse_request: every field checked once where it enters
    controlnet_units.py  ControlNet units: checked, preprocessed, weighted per step
    hires.py             the hires fix's rules: upscalers by A1111's names, sizes, A1111's step rule
    image_inputs.py      the init image and the mask: checked, decoded (guarded), fitted
    regions.py           regional prompts: the divide syntax or a painted mask, the parts split on BREAK
    styles.py            the style templates (assets/styles.json) and the examples
    sizes.py             the offered sizes
    sampler_names.py     A1111's sampler and schedule names <-> the engine's ids
    presets.py           the few-step recipes (assets/presets.json)
    stopping.py          StopFlag and Stopped
    parameters.py        the `parameters` text (A1111's infotext) and the status line: the one writer and reader
    image_files.py       images -> PNG and JPEG files carrying that text, and the text read back from a file
    engine.py            the `Engine` protocol: what the page reads of an engine, local or remote

The engine's packages import from here; nothing here imports them, so web/ can use it without loading JAX.
"""
