"""Past generations: the History tab, where its entries are kept, and how their files reach their owner.

One package for the history's seven modules, so `web/`'s top level holds the page and its parts:
    tab.py           the History tab and the `/history` endpoint, one class per storage mode: none (`--no-history`),
                     the server's (logins), the browser's; what the page imports
    store.py         `HistoryStore`: past generations per signed-in user, rows in one database and files in one store
    database.py      the rows through SQLAlchemy Core: SQLite under `--data-dir`, or PostgreSQL (`--database-url`)
    image_store.py   the files: a directory (a volume replicas share) or an fsspec URL (`--image-store`)
    file_route.py    the image files served to their owner only (ASGI middleware), never through Gradio's cache
    browser.py       a visitor's history without logins, kept in their own browser (Gradio's BrowserState)
    migrate.py       `python -m web.history.migrate`: a one-process SQLite history moved to PostgreSQL and a shared
                     image store, for page replicas

Nothing is re-exported here: importing the package imports no database library, and each caller names the module
it needs (`from web.history.tab import History`).
"""
