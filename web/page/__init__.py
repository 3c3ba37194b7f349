"""The page: what a visitor sees and what its events run.

    layout.py            `build_page`: the page's sections, then its events wired to the handlers; `Page`
    handlers.py          what the page's events and the API's endpoints run: one request in, images and a status out
    form.py              the generation form as settings, and the form filled back from settings
    controlnet_panel.py  the ControlNet panel: picture, the preprocessor's map, weight and range
    image_prompt_panel.py  the "Image prompt" section: a picture, adapter, weight and range per slot
    xyz_panel.py         the "X/Y/Z plot" section and its plot: the form's request with up to three axes, one event
    outpaint_panel.py    the Outpaint choice: directions, pixels, the grown canvas shown
    examples.py          the example prompts' buttons and their kept answers
    texts.py             what the page says: title, header, footer, the model's card, the status line's pieces
    size_labels.py       the page's names for the offered sizes ('1344×768 (16:9)')
    png_info.py          settings back from an image's `parameters` text
    prompt_filter.py     the optional deny-list for prompts (`--prompt-filter FILE`)
    sessions.py          per-session state: each tab's Stop flag, the gallery it was shown, its early cancel

Nothing is re-exported here: importing the package imports no Gradio (app.py reads `size_labels` and `texts` before
Gradio is imported), and each caller names the module it needs (`from web.page.layout import build_page`).
"""
