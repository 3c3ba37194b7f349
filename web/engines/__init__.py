"""The engine clients: a page in front of engine services (`python app.py --engine URL ...`), no JAX, no weights.

remote.py   `RemoteEngines`: the engine services as the page's engine (what web/page/handlers.py calls)
pool.py     `EnginePool`: the engines' addresses, which are ready, which are free (standard library only)
"""
