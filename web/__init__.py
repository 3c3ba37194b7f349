"""The page in front of the engine: Gradio only, no JAX. The engine is `pipeline/`.

Its rooms, by what they serve:
    page/                the page: layout and events, what they run, the form, its texts, sessions, PNG Info
    engines/             the engine clients of a page in front of engine services (`--engine URL`)
    serving/             the process and its HTTP plumbing: the server, temporary files, answer files, middleware
    apis/                the HTTP APIs on the page's port: AUTOMATIC1111's, OpenAI Images, MCP
    history/             past generations: the History tab, its stores, its owner-only file route
    options.py           the web server's own options and the app's command line (`python -m web.options`)
    gradio_internals.py  every use of Gradio's internals, in one place (checked by tests/web/test_gradio_internals.py)

Importing `web` (or any of its packages) imports neither Gradio nor JAX (app.py installs its Ctrl-C guard first);
the modules that need Gradio import it themselves.
"""
