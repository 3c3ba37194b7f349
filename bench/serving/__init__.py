"""The engine served: through the Gradio app with gradio_client (the `app`, `soak`, `hostpath`, `fullsize` and
`apphost` parts), as an engine service behind the page (`service`), and through the HTTP APIs
(`python -m bench.serving.apis`)."""
