"""Serving the page: the process around it and its HTTP plumbing.

    server.py          Gradio's launch settings, the port check, serving until a signal
    startup_guard.py   Ctrl-C during start-up: one line, exit status 130, nothing left behind
    fast_exit.py       leaving the process once everything is closed, without the interpreter's teardown
    temp_files.py      the process's temporary folder (Gradio's cache, each page's runs), removed at exit
    outbox.py          a request's images as files: the gallery's JPEGs now, lossless PNGs in the background
    twin_routing.py    ASGI middleware: a /generate call without previews goes to its plain-function twin
    asgi_json_body.py  reading a request's JSON body in ASGI middleware and passing the request on whole

Nothing is re-exported here: `startup_guard`, `fast_exit` and `temp_files` are imported before Gradio and JAX.
"""
