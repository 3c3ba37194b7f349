"""The engine as an HTTP service (`python -m pipeline serve`): the server, its token, its metrics, its wire format.

Only `server.py` touches the engine (and so JAX); `wire.py`, `auth.py`, `metrics.py` and `options.py` import no JAX,
so the page in front (web/engines/remote.py) reads the same wire format without loading JAX.
"""
