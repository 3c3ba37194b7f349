"""The page: Gradio only (layout, handlers, per-session state, files, options, serving). The engine is `pipeline/`.

Importing `web` imports neither Gradio nor JAX (app.py installs its Ctrl-C guard first); the modules that need
Gradio import it themselves.
"""
