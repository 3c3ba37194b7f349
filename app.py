"""Gradio web app: Stable Diffusion XL on JAX, one image per accelerator core (`python app.py --model tiny`; every
way to run it: docs/run.md, every option: `python app.py --help` or docs/options.md). The order is the file's:
options -> engine (load, compile, warm up: no visitor ever waits for a compile) -> page -> serve. The engine is
`pipeline/` (no Gradio), the page is `web/` (no JAX); this file only wires them.

Imported inside functions (heavy: Gradio and JAX): the `pipeline` and `web` modules each step needs are imported when
that step starts, so a wrong option or path exits in a moment, before Gradio loads and before JAX starts, which must
come after `use_cpu_cores()` sets the CPU device count.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence

if __name__ == "__main__":  # before the imports below: run before `pip install`, one sentence, not a traceback
    from pipeline.installed import require_installed

    require_installed("app.py")

from web.serving.fast_exit import leave  # noqa: E402
from web.serving.startup_guard import EXIT_INTERRUPTED, StartupGuard  # noqa: E402
from web.serving.temp_files import ProcessFolder  # noqa: E402

logger = logging.getLogger("sdxl_jax.app")


def start_cluster_and_engine(args):
    """(the cluster, this process's engine, loaded and warm: pipeline/startup.py); with --engine, (None, the engine
    services: no JAX)."""
    if args.engine:
        from pipeline.service.auth import token_from
        from web.engines.remote import RemoteEngines

        return None, RemoteEngines.connect(args.engine, token_from(args.engine_token))
    from pipeline.cluster.join_options import options_from_args
    from pipeline.platform import accelerator_installed
    from pipeline.startup import start
    from web.page.size_labels import size_label
    from web.page.texts import CPU_NOTICE, is_tiny, sampler_summary

    real_model = not is_tiny(args.config.model)
    if real_model and not accelerator_installed():  # say it before a download and a compile that take very long
        logger.warning(CPU_NOTICE.replace("`", ""))

    def describe(generator) -> None:  # the page's own words for what was loaded, before the compile
        if real_model and accelerator_installed() and str(generator.device_kind).lower() == "cpu":
            logger.warning(CPU_NOTICE.replace("`", ""))  # a GPU/TPU plugin is installed but found no device
        if len(generator.sizes) > 1:
            logger.info("sizes: %s", ", ".join(size_label(h, w) for h, w in generator.sizes))
        logger.info("sampler: %s", sampler_summary(generator))

    started = start(args.config, options_from_args(args), precompiled=args.precompiled, on_loaded=describe)
    return started.cluster, started.engine


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own start-up checks
    with StartupGuard("app.py", cleanup=ProcessFolder.remove_all) as guard:  # before Gradio or JAX is imported
        from web.options import parse_args

        args = parse_args(argv)
        if problem := model_problem(args):
            print(f"app.py: error: {problem}", file=sys.stderr)
            return 2
        from pipeline.contract.errors import InvalidInput, ModelLoadError  # neither imports JAX
        from pipeline.contract.styles import StyleFileError, load_examples
        from pipeline.platform import quiet_start
        from web.history.store import HistoryLocked
        from web.history.tab import History
        from web.page.prompt_filter import PromptFilter
        from web.serving.server import port_problem, serve_until_signal

        serves = args.process_id in (None, 0)  # process 0 (or the only one) serves the page; the others follow
        if serves and (problem := port_problem(args.host, args.port)):
            print(f"app.py: error: {problem}", file=sys.stderr)
            return 2
        if not args.engine:  # this process loads models: the hub's lines once
            quiet_start()
        history = History.off()
        try:
            prompt_filter = PromptFilter.from_file(args.prompt_filter) if args.prompt_filter else None
            if serves and not args.no_history:  # opened first: a data folder in use or unwritable fails at once
                history = open_history(args)
            examples = load_examples()
            cluster, generator = guard.run(lambda: start_cluster_and_engine(args))
        except (OSError, StyleFileError, ModelLoadError, InvalidInput, HistoryLocked) as exc:
            history.close()
            print(f"app.py: error: {exc}", file=sys.stderr)
            return 2
        log_page_options(args, prompt_filter, history)
        if cluster is not None and not cluster.is_leader:
            return cluster.follow(generator)  # runs what process 0 is asked, until process 0 stops
        started = time.perf_counter()
        engine = cluster.lead(generator) if cluster is not None else generator
        page, apis = page_with_apis(args, engine, examples, prompt_filter, history)
    try:
        return serve_until_signal(
            page, host=args.host, port=args.port, share=args.share, auth=args.auth, started=started, **apis
        )
    finally:
        page.close()
        if cluster is not None:
            cluster.stop()  # STOP to the followers (a no-op on one process)
        else:
            generator.close()  # the engine services' prober


def model_problem(args) -> str | None:
    """What is wrong with --model, --lora-dir or --embeddings-dir, said in a moment, before Gradio and JAX are
    imported; None when nothing is, or when this process runs no engine (--engine: in front of engine services, no
    devices to split nor to log). The CPU is split into devices first: before anything imports JAX."""
    if args.engine:
        return None
    from pipeline.contract.errors import InvalidInput, ModelLoadError  # neither imports JAX
    from pipeline.platform import use_cpu_cores
    from pipeline.startup import check

    use_cpu_cores(args.cpu_devices)  # before anything imports JAX
    try:
        check(args.config)
    except (OSError, ModelLoadError, InvalidInput) as exc:
        return str(exc)
    return None


def open_history(args):
    """The server's history (web/history/tab.py), opened before the engine loads: a data folder in use or
    unwritable fails at once."""
    from web.history.store import default_data_dir
    from web.history.tab import History

    return History.for_server(
        args.data_dir or default_data_dir(),
        logins=bool(args.auth),
        max_entries=args.history_max,
        database_url=args.database_url,
        image_store=args.image_store,
    )


def log_page_options(args, prompt_filter, history) -> None:
    """One line each for the prompt filter and the history, when the server has them."""
    if prompt_filter is not None:
        logger.info("prompt filter: %d blocked words or phrases from %s", len(prompt_filter), args.prompt_filter)
    if history.store is not None:
        logger.info("history: kept per login in %s (up to %d each)", history.store.where(), args.history_max)


def page_with_apis(args, engine, examples, prompt_filter, history):
    """The page around the ready engine, and the APIs beside it (A1111, OpenAI Images, MCP: through the page's
    queue): (page, the APIs' settings for `serve_until_signal`)."""
    from web.apis import ApiAccess, attach_apis
    from web.page.layout import build_page

    page = build_page(
        engine,
        examples=examples,
        prompt_filter=prompt_filter,
        queue_size=args.queue_size,
        xyz_max_cells=args.xyz_max_cells,
        progress=not args.no_progress,
        history=history,
        logins=bool(args.auth),
    )
    return page, attach_apis(page, ApiAccess.from_args(args))


if __name__ == "__main__":
    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C before the guard was in place: the same one line, never a traceback
        print("app.py: stopped during start-up", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    leave(code)  # everything is closed: exit handlers, then no interpreter teardown (web/serving/fast_exit.py)
