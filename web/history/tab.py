"""Past generations: the History tab and the `/history` endpoint, kept where the server's logins say.

One class per storage mode. With logins (`--auth`, `ServerHistory`), every finished request goes to the server's
store (web/history/store.py: SQLite under `--data-dir`, or `--database-url` and `--image-store` shared by page
replicas), written in the background once its PNGs are, and each user sees, uses and deletes only their own; the
images come from an owner-only route (web/history/file_route.py). Without logins (`BrowserHistory`), a visitor's
history lives in their own browser (Gradio's BrowserState, web/history/browser.py) and the server keeps nothing.
`History` itself is the tab and its events, with nothing kept (--no-history).

    history = History.for_server(data_dir, logins=True, max_entries=500)   # or History.off()
    handlers = Handlers(..., on_finished=history.keep)               # every delivered request
    state = history.state()                                           # at the page's top level
    tab = history.layout(state)                                       # inside the page's gr.Tabs
    history.wire(tab, form, tabs, generated=[...])                    # with the page's events
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import logging
import re
import secrets
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from pipeline.contract.errors import InvalidInput
from pipeline.contract.hires import second_pass_steps
from pipeline.contract.parameters import PICTURE_STATUS, status_parts, status_steps
from pipeline.contract.styles import DEFAULT_STYLE

from ..gradio_internals import public_root
from ..page.form import Form, request_settings
from ..page.handlers import PNG_WAIT_S, Finished, invalid
from ..page.sessions import session_of
from ..serving.temp_files import RunFiles
from .browser import (
    BROWSER_MAX_ENTRIES,
    add_entry,
    browser_entry,
    browser_secret,
    clean_entries,
    delete_entry,
    thumbnail_jpegs,
)
from .file_route import file_url, owner_files_middleware
from .store import HistoryStore

logger = logging.getLogger("sdxl_jax.app")

#: Entries the History tab shows at once (newest first); /history pages through up to MAX_LIST per call.
TAB_ENTRIES = 200
#: Characters of a prompt in a thumbnail's caption: with the seed, three short lines under a 150 px thumbnail (the
#: whole prompt is in the entry's details).
CAPTION_CHARS = 32
#: Sessions whose finished requests wait for their browser to keep them (no logins), the most each holds, and the
#: seconds one is offered: until the browser's list shows it (two requests finishing close together may both be
#: answered before the browser's list has the first: each follow-up then offers both).
WAITING_SESSIONS = 256
WAITING_PER_SESSION = 4
WAITING_S = 300.0
NO_HISTORY = "This server keeps no history (it runs with --no-history)."
IN_BROWSER = "This server has no logins, so it keeps no history: the page keeps each visitor's in their own browser."
NOTHING_SELECTED = "Click an entry first."


@dataclass(frozen=True)
class HistoryTab:
    """The History tab's components."""

    tab: gr.Tab
    state: gr.State  # the browser's entries (BrowserState) without logins; a placeholder (None) with them
    summary: gr.Markdown  # "12 entries"
    gallery: gr.Gallery  # one thumbnail per entry, newest first
    details: gr.Markdown  # the clicked entry's settings
    use: gr.Button
    delete: gr.Button
    delete_all: gr.Button
    confirm: gr.Row  # "Delete every entry?" (shown by delete_all)
    really: gr.Button
    keep: gr.Button
    listing: gr.JSON  # /history's output
    limit: gr.Number  # /history's inputs
    offset: gr.Number
    api: gr.Button  # /history's trigger


class History:
    """The page's past generations, by storage mode: this class is the tab and its events, with nothing kept (the
    server runs with --no-history); `ServerHistory` keeps them in the server's store, `BrowserHistory` in each
    visitor's browser."""

    store: HistoryStore | None = None  # the server's store (ServerHistory only)
    enabled = False  # whether the page shows a History tab
    where = ""  # where the entries are kept, as the tab says it

    def __init__(self) -> None:
        self._listed: dict[str, list] = {}  # session -> entry ids its tab shows, in order
        self._selected: dict[str, Any] = {}  # session -> the entry id it clicked
        self._lock = threading.Lock()
        self.files: RunFiles | None = None  # the page's files (set by the page): where browser thumbnails go

    @classmethod
    def off(cls) -> History:
        return cls()

    @classmethod
    def for_server(
        cls,
        data_dir: str | Path,
        *,
        logins: bool,
        max_entries: int | None,
        database_url: str | None = None,
        image_store: str | None = None,
    ) -> History:
        """Logins: a store in `data_dir` (kept `max_entries` per user), or in the database and image store the URLs
        name (shared by page replicas); none: browsers keep their own."""
        if logins:
            return ServerHistory(
                HistoryStore(data_dir, max_entries, database_url=database_url, image_store=image_store)
            )
        try:
            secret = browser_secret(data_dir)
        except OSError as exc:  # the browsers' history still works; it just cannot outlive this run
            logger.warning(
                "history: cannot keep the browsers' key in %s (%s); their history lasts until a restart",
                data_dir,
                exc.strerror or exc,
            )
            secret = None
        return BrowserHistory(secret)

    def middleware(self) -> list:
        """ASGI middleware the page needs (the server's owner-only file route)."""
        return []

    def close(self) -> None:
        """Finish the writes under way and close the store (a mode that has them)."""

    def keep(self, finished: Finished) -> None:
        """Handlers' `on_finished`: what a mode keeps of every delivered request."""

    def state(self) -> gr.State | None:
        """The mode's per-visitor state, made at the page's top level (a component inside a tab only exists in the
        browser once that tab is opened); None without a history."""
        return None

    # ---- reading -------------------------------------------------------------------------------------------------

    def show(self, entries: Any = None, request: gr.Request = None):
        """The tab's gallery (one thumbnail per entry, newest first, captioned with prompt and seed) and a cleared
        details panel."""
        session = session_of(request)
        items, ids = self._listing(entries, request)
        with self._lock:
            self._listed[session] = ids
            self._selected.pop(session, None)
        return items or None, _summary(len(ids))

    def select(self, evt: gr.SelectData, entries: Any = None, request: gr.Request = None) -> str:
        """An entry clicked: its settings, in full, under the gallery."""
        session = session_of(request)
        with self._lock:
            ids = self._listed.get(session, [])
            entry_id = ids[evt.index] if isinstance(evt.index, int) and 0 <= evt.index < len(ids) else None
            self._selected[session] = entry_id
        settings, created = self._settings(entry_id, entries, request) if entry_id is not None else (None, None)
        return _details(settings, created) if settings is not None else NOTHING_SELECTED

    def use(self, form: Form):
        """ "Use these settings": the selected entry's settings into the form, and the Generate tab shown."""

        def use_settings(entries: Any = None, request: gr.Request = None):
            entry_id = self._selected.get(session_of(request))
            settings, _ = self._settings(entry_id, entries, request) if entry_id is not None else (None, None)
            if settings is None:
                raise gr.Error(NOTHING_SELECTED, title="History", print_exception=False)
            updates, notes = form.fill(settings)
            for note in notes:
                gr.Warning(note)
            return *updates, gr.Tabs(selected="generate")

        return use_settings

    def delete(self, entries: Any = None, request: gr.Request = None):
        """Delete the selected entry (its files too); the tab shows what is left."""
        entry_id = self._selected.get(session_of(request))
        if entry_id is None:
            raise gr.Error(NOTHING_SELECTED, title="History", print_exception=False)
        kept = self._delete(entry_id, entries, request)
        gallery, summary = self.show(kept, request)
        return kept, gallery, summary, ""

    def delete_all(self, entries: Any = None, request: gr.Request = None):
        """Delete every entry of this user (or this browser); other users' stay."""
        count = self._delete_all(entries, request)
        gr.Info(f"Deleted {count} entr{'y' if count == 1 else 'ies'}.")
        gallery, summary = self.show([], request)
        return [], gallery, summary, "", gr.update(visible=False)

    # ---- the tab ---------------------------------------------------------------------------------------------------

    def layout(self, state: gr.State | None) -> HistoryTab | None:
        """The History tab (inside the page's `gr.Tabs`); None when the server keeps no history."""
        if state is None:
            return None
        with gr.Tab("History", id="history", elem_id="history-tab") as tab:
            gr.Markdown(f"Your past generations, newest first: kept {self.where}.", elem_id="history-where")
            summary = gr.Markdown("", elem_id="history-summary")
            gallery = history_gallery()
            details = gr.Markdown("", elem_id="history-details")
            with gr.Row():
                use = gr.Button("Use these settings", variant="primary", elem_id="history-use")
                delete = gr.Button("Delete", elem_id="history-delete")
                delete_all = gr.Button("Delete all of mine", variant="stop", elem_id="history-delete-all")
            with gr.Row(visible=False, elem_id="history-confirm") as confirm:
                gr.Markdown("Delete every entry of your history? This cannot be undone.")
                really = gr.Button("Yes, delete all", variant="stop", elem_id="history-delete-all-yes")
                keep = gr.Button("No", elem_id="history-delete-all-no")
            listing = gr.JSON(visible=False, label="history")  # /history's answer
            limit = gr.Number(value=100, precision=0, visible=False, label="limit")
            offset = gr.Number(value=0, precision=0, visible=False, label="offset")
            api = gr.Button(visible=False, elem_id="history-api")
        return HistoryTab(
            tab,
            state,
            summary,
            gallery,
            details,
            use,
            delete,
            delete_all,
            confirm,
            really,
            keep,
            listing,
            limit,
            offset,
            api,
        )

    def wire(self, ui: HistoryTab, form: Form, tabs: gr.Tabs, generated: list) -> None:
        """The tab's events, and /history; `generated`: the page's generation events."""
        shown = {"api_visibility": "private", "concurrency_limit": 4, "concurrency_id": "history"}
        ui.tab.select(self.show, inputs=ui.state, outputs=[ui.gallery, ui.summary], **shown)
        ui.gallery.select(self.select, inputs=ui.state, outputs=ui.details, **shown)
        ui.use.click(self.use(form), inputs=ui.state, outputs=[*form.fields, tabs], **shown)
        ui.delete.click(self.delete, inputs=ui.state, outputs=[ui.state, ui.gallery, ui.summary, ui.details], **shown)
        ui.delete_all.click(lambda: gr.update(visible=True), outputs=ui.confirm, queue=False, api_visibility="private")
        ui.keep.click(lambda: gr.update(visible=False), outputs=ui.confirm, queue=False, api_visibility="private")
        ui.really.click(
            self.delete_all,
            inputs=ui.state,
            outputs=[ui.state, ui.gallery, ui.summary, ui.details, ui.confirm],
            **shown,
        )
        self._wire_mode(ui, generated, shown)
        ui.api.click(
            self._api(),
            inputs=[ui.limit, ui.offset],
            outputs=ui.listing,
            api_name="history",
            api_description="Your past generations as JSON, newest first (on a server with logins).",
            concurrency_limit=4,
            concurrency_id="history",
        )

    # ---- what a storage mode gives -----------------------------------------------------------------------------------

    def _wire_mode(self, ui: HistoryTab, generated: list, shown: dict) -> None:
        """The mode's own events."""

    def _api(self):
        """/history's function: refused without logins."""
        return _refuse(NO_HISTORY)

    def _listing(self, entries: Any, request: gr.Request | None) -> tuple[list, list]:
        """The tab's gallery items and their entry ids, newest first."""
        return [], []

    def _settings(self, entry_id, entries, request) -> tuple[dict | None, float | None]:
        """The settings and time of an entry of this caller's (None, None for anything else)."""
        return None, None

    def _delete(self, entry_id, entries, request) -> Any:
        """Delete one entry; the state's new value."""
        return entries

    def _delete_all(self, entries, request) -> int:
        """Delete every entry of the caller's; how many there were."""
        return 0


class ServerHistory(History):
    """With logins: every finished request goes to the server's store, written in the background once its PNGs are;
    each user sees, uses and deletes only their own, and their images come from an owner-only route."""

    enabled = True
    where = "on this server, for your login only"

    def __init__(self, store: HistoryStore) -> None:
        super().__init__()
        self.store = store  # every user's entries
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="history")
        self._pending: dict[str, list[Future]] = collections.defaultdict(list)  # user -> writes not yet done

    def middleware(self) -> list:
        return [owner_files_middleware(self._file)]

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self.store.close()

    def keep(self, finished: Finished) -> None:
        """The store writes it in the background (after its PNGs)."""
        settings = request_settings(finished.request, finished.result)
        if finished.user:
            future = self._writer.submit(self._write, finished.user, settings, finished.delivery)
            with self._lock:
                pending = self._pending[finished.user]
                pending[:] = [f for f in pending if not f.done()] + [future]

    def state(self) -> gr.State:
        return gr.State(None)  # a placeholder: the store holds the entries

    def _write(self, user: str, settings: dict, delivery) -> int | None:
        """One entry: the lossless PNGs (with their parameters), thumbnails from the gallery's JPEGs."""
        try:
            pngs = [Path(future.result(timeout=PNG_WAIT_S)) for future in delivery.pngs]
            started = time.perf_counter()
            entry_id = self.store.add(user, settings, pngs, thumbnail_sources=list(delivery.gallery))
            logger.info(
                "history: kept entry %d (%d images) in %.0f ms",
                entry_id,
                len(pngs),
                (time.perf_counter() - started) * 1000,
            )
            return entry_id
        except Exception:  # the request was answered; only its history entry is lost
            logger.exception("history: could not keep a finished request")
            return None

    def _settled(self, user: str) -> None:
        """Wait for `user`'s writes under way (their last request shows up in a listing made right after it)."""
        with self._lock:
            pending = list(self._pending.get(user, ()))
        for future in pending:
            with contextlib.suppress(Exception):  # a failed write is logged by _write
                future.result(timeout=PNG_WAIT_S)

    def api(self, limit: int = 100, offset: int = 0, request: gr.Request = None) -> list[dict]:
        """The caller's past generations, newest first: each with its settings (prompt, negative_prompt, seed,
        steps, sampler, guidance_scale, width, height, ...), `id`, `created` (ISO 8601, UTC) and `images` (URLs of
        the lossless PNGs, for this login only; `thumbnails` likewise). `limit`: up to 1000; `offset`: entries to
        skip. Only with logins: without, each visitor's history stays in their browser."""
        user = self._user(request)
        try:
            entries = self.store.list(user, limit=_whole(limit, "limit"), offset=_whole(offset, "offset"))
        except InvalidInput as exc:
            raise invalid(exc) from None
        root = public_root(request)
        return [
            {
                **entry.as_json(images=[file_url(root, entry.id, i) for i in range(len(entry.images))]),
                "thumbnails": [file_url(root, entry.id, i, thumbnail=True) for i in range(len(entry.thumbnails))],
            }
            for entry in entries
        ]

    def _api(self):
        return self.api

    def _listing(self, entries: Any, request: gr.Request | None) -> tuple[list, list]:
        listed = self.store.list(self._user(request), limit=TAB_ENTRIES)
        root = public_root(request)
        return [(file_url(root, e.id, 0, thumbnail=True), caption(e.settings)) for e in listed], [e.id for e in listed]

    def _settings(self, entry_id, entries, request) -> tuple[dict | None, float | None]:
        entry = self.store.get(self._user(request), entry_id)
        return (entry.settings, entry.created) if entry is not None else (None, None)

    def _delete(self, entry_id, entries, request) -> Any:
        self.store.delete(self._user(request), entry_id)
        return entries

    def _delete_all(self, entries, request) -> int:
        return self.store.delete_all(self._user(request))

    def _user(self, request: gr.Request | None) -> str:
        user = getattr(request, "username", None)
        if not user:
            raise gr.Error("Sign in to see your history.", title="History", print_exception=False)
        self._settled(user)
        return user

    def _file(self, user: str, entry_id: int, index: int, thumbnail: bool) -> Path | bytes | None:
        """The owner-only route's lookup: `user`'s file (a path, or its bytes from an object store), or None."""
        try:
            return self.store.file_of(user, entry_id, index, thumbnail)
        except InvalidInput:
            return None


class BrowserHistory(History):
    """Without logins: a visitor's history lives in their own browser (Gradio's BrowserState) and the server keeps
    nothing; each finished request is handed to the browser by the page's follow-up event."""

    enabled = True
    where = f"in this browser only (the last {BROWSER_MAX_ENTRIES}; the server keeps nothing)"

    def __init__(self, secret: str | None) -> None:
        super().__init__()
        self.secret = secret  # the BrowserState's key (kept in the data folder: it survives a restart)
        #: session -> its finished requests not yet seen in its browser's list, oldest first: {"id", "created",
        #: "settings", "images"} each (the thumbnails are made by `remember_in_browser`, off the answer's path)
        self._waiting: collections.OrderedDict[str, list[dict]] = collections.OrderedDict()

    def keep(self, finished: Finished) -> None:
        """Held for the session's browser, which takes it with `remember_in_browser`."""
        if not finished.session:
            return
        settings = request_settings(finished.request, finished.result)
        waiting = {
            "id": secrets.token_hex(8),
            "created": time.time(),
            "settings": settings,
            "images": list(finished.delivery.gallery),
        }
        with self._lock:
            pending = self._waiting.setdefault(finished.session, [])
            pending[:] = [*pending, waiting][-WAITING_PER_SESSION:]
            self._waiting.move_to_end(finished.session)
            while len(self._waiting) > WAITING_SESSIONS:
                self._waiting.popitem(last=False)

    def state(self) -> gr.BrowserState:
        return gr.BrowserState([], storage_key="sdxl-jax-history", secret=self.secret)

    def remember_in_browser(self, entries: Any, request: gr.Request = None) -> list[dict]:
        """The page's follow-up: the session's finished requests that its browser's list lacks, added to it. One
        stays offered until a list comes back with it (or `WAITING_S`): the follow-up of a request that finished
        right after may carry the list from before the first's was stored, and then offers both."""
        entries = clean_entries(entries)
        have, now = {entry["id"] for entry in entries}, time.time()
        with self._lock:
            pending = self._waiting.get(session_of(request), [])
            pending[:] = [item for item in pending if item["id"] not in have and now - item["created"] < WAITING_S]
            offered = list(pending)
        for item in offered:  # oldest first: the newest ends first in the list
            try:
                entry = browser_entry(item["settings"], item["images"], item["created"], item["id"])
            except OSError:  # its files are gone already (a very old run): nothing to keep
                continue
            entries = add_entry(entries, entry)
        return entries

    def _forget(self, request, entry_ids: set[str] | None = None) -> None:
        """Deleted in the browser: never offered again (`entry_ids`; None: all of the session's)."""
        with self._lock:
            pending = self._waiting.get(session_of(request), [])
            pending[:] = [] if entry_ids is None else [item for item in pending if item["id"] not in entry_ids]

    def _wire_mode(self, ui: HistoryTab, generated: list, shown: dict) -> None:
        """The browser keeps each generation's result once it is answered; the tab follows the browser's list (a
        request finishing while it is open shows up at once)."""
        for event in generated:
            event.success(self.remember_in_browser, inputs=ui.state, outputs=ui.state, show_progress="hidden", **shown)
        ui.state.change(self.show, inputs=ui.state, outputs=[ui.gallery, ui.summary], show_progress="hidden", **shown)

    def _api(self):
        return _refuse(IN_BROWSER)

    def _listing(self, entries: Any, request: gr.Request | None) -> tuple[list, list]:
        items, ids = [], []
        for entry in clean_entries(entries):
            pictures = thumbnail_jpegs(entry)
            if pictures and self.files is not None:
                items.append((str(self.files.content_file(pictures[0], ".jpg")), caption(entry["settings"])))
                ids.append(entry["id"])
        return items, ids

    def _settings(self, entry_id, entries, request) -> tuple[dict | None, float | None]:
        for entry in clean_entries(entries):
            if entry["id"] == entry_id:
                return entry["settings"], entry["created"]
        return None, None

    def _delete(self, entry_id, entries, request) -> Any:
        self._forget(request, {entry_id})
        return delete_entry(clean_entries(entries), entry_id)

    def _delete_all(self, entries, request) -> int:
        self._forget(request)
        return len(clean_entries(entries))


def _refuse(message: str):
    def refuse(limit: int = 100, offset: int = 0) -> list:
        """Without logins the server keeps no history (each visitor's stays in their browser)."""
        raise gr.Error(message, title="History", print_exception=False)

    return refuse


def _whole(value: Any, name: str) -> int:
    """An API number as a whole number (gradio_client sends floats for gr.Number)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidInput(f"The history {name} must be a whole number; got {str(value)[:40]!r}.")


def history_gallery(value=None) -> gr.Gallery:
    """The tab's thumbnails (laid out by assets/style.css: `#history-gallery`)."""
    return gr.Gallery(
        value=value,
        label="Past generations",
        show_label=False,
        columns=6,
        height="auto",
        object_fit="cover",
        allow_preview=False,
        interactive=False,
        elem_id="history-gallery",
    )


def caption(settings: dict) -> str:
    """A thumbnail's caption: the seed, then the prompt's first words (`CAPTION_CHARS`)."""
    prompt = " ".join(str(settings.get("prompt", "")).split())
    prompt = prompt if len(prompt) <= CAPTION_CHARS else prompt[: CAPTION_CHARS - 1] + "…"
    return f"seed {settings.get('seed')} · {prompt}"  # the seed first: it tells two tries of one prompt apart


def _summary(count: int) -> str:
    if count == 0:
        return "Nothing yet: every image you generate is kept here."
    newest = f" (the newest {TAB_ENTRIES})" if count >= TAB_ENTRIES else ""
    return f"{count} entr{'y' if count == 1 else 'ies'}{newest}"


def _details(settings: dict, created: float | None) -> str:
    """An entry's settings as a short list (Markdown; user text in code spans, so it is shown, never rendered)."""
    when = datetime.datetime.fromtimestamp(created).strftime("%Y-%m-%d %H:%M") if created else ""
    lines = [f"**{when}**"] if when else []
    for key, label in (("prompt", "Prompt"), ("negative_prompt", "Negative prompt"), ("style", "Style")):
        value = settings.get(key)
        if value and value != DEFAULT_STYLE:
            lines.append(f"- {label}: {_code(value)}")
    lines.append(
        f"- {settings.get('width')}×{settings.get('height')} · {_steps(settings)}, "
        f"{settings.get('sampler')} · guidance {settings.get('guidance_scale')} · seed {settings.get('seed')}"
    )
    extras = status_parts(settings, PICTURE_STATUS.get(settings.get("picture") or ""))  # the status line's words
    for item in settings.get("loras") or []:
        if isinstance(item, list | tuple) and item:
            extras.append(f"LoRA {_code(item[0])} {item[1] if len(item) > 1 else ''}")
    if extras:
        lines.append("- " + " · ".join(extras))
    return "\n".join(lines)


def _steps(settings: dict) -> str:
    """The steps that ran, as the status line says them: "4 steps", with the hires fix "4 + 4 steps"."""
    steps, scale = settings.get("steps"), settings.get("hires_scale")
    if not isinstance(steps, int) or scale in (None, 1.0):
        return f"{steps} steps"
    second = second_pass_steps(steps, settings.get("hires_steps") or 0, settings.get("hires_denoise") or 1.0)[1]
    return status_steps(steps, second)


def _code(text: object) -> str:
    """`text` as an inline code span that no backtick in it can close."""
    value = " ".join(str(text).split())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", value)), default=0) + 1)
    return f"{fence} {value} {fence}"
