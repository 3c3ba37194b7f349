"""Every option declared once (pipeline/options.py, the server's in web/options.py): the app's, the CLI's, the
precompile's, make-tiny's, the engine service's and the bench's parsers come from the tables, environment variables fill
what flags leave out (the flag wins), errors are one line, and `engine_config` resolves what the engine loads: flags,
else the preset's settings, else the model's defaults."""

from __future__ import annotations

import argparse

import pytest

from pipeline import options
from pipeline.__main__ import build_parser
from pipeline.config import SDXL_BASE, engine_config, shape_defaults
from web import options as web_options
from web.options import ALL_OPTIONS, parse_args, read_auth


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's actions by flag (a positional by its name)."""
    return {(action.option_strings or [action.dest])[0]: action for action in parser._actions}


def _subparser(name: str) -> argparse.ArgumentParser:
    return build_parser()._subparsers._group_actions[0].choices[name]


def _generate_parser() -> argparse.ArgumentParser:
    return _subparser("generate")


def app_parser() -> argparse.ArgumentParser:
    parser = options.Parser(prog="app.py")
    options.add_options(parser, options.APP, ALL_OPTIONS)
    return parser


def bench_parser() -> argparse.ArgumentParser:
    from bench.__main__ import build_parser as bench_build_parser

    return bench_build_parser()


# ---- one declaration, every parser ---------------------------------------------------------------------------------


def test_every_parser_comes_from_the_options_table(monkeypatch):
    parsers = {
        options.APP: _flags(app_parser()),
        options.CLI: _flags(_generate_parser()),
        options.PRECOMPILE: _flags(_subparser("precompile")),
        options.BENCH: _flags(bench_parser()),
        options.SERVE: _flags(_subparser("serve")),
        options.MAKE_TINY: _flags(_subparser("make-tiny")),
    }
    for option in ALL_OPTIONS:  # a flag two programs spell alike (--out, --host) is a row each: told by its help
        for program, actions in parsers.items():
            action = actions.get(option.flag)
            from_table = action is not None and action.help.startswith(option.help)
            assert from_table == (program in options.programs_of(option)), (program, option.flag)
        taker = next((program for program in parsers if program in options.programs_of(option)), None)
        if option.env and taker:
            assert option.env in parsers[taker][option.flag].help, option.flag
    # The next option is one line of the table, and both programs take it: the app reads web/options.py's ALL_OPTIONS,
    # the CLI add_options' own table (pipeline/options.py's OPTIONS, its default argument).
    extra = options.Option("--frobnicate", "a new knob", "SDXL_FROBNICATE", int, 3)
    monkeypatch.setattr(web_options, "ALL_OPTIONS", (*ALL_OPTIONS, extra))
    monkeypatch.setattr(options.add_options, "__defaults__", ((*options.OPTIONS, extra), None))
    monkeypatch.setenv("SDXL_FROBNICATE", "7")
    assert parse_args(["--model", "tiny"]).frobnicate == 7
    assert _generate_parser().parse_args(["--prompt", "x", "--out", "o"]).frobnicate == 7


def test_the_bench_takes_the_engine_options_with_its_own_defaults(monkeypatch):
    from bench.__main__ import parse_args as bench_args

    for name in ("SDXL_MODEL", "SDXL_HEIGHT", "SDXL_WIDTH", "SDXL_STEPS", "SDXL_DTYPE", "SDXL_CPU_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    args = bench_args([])
    assert (args.model, args.height, args.width, args.steps, args.dtype, args.cpu_devices) == (
        "tiny",
        128,
        128,
        4,
        "float32",
        8,
    )
    assert (args.config.model, args.config.height, args.config.width, args.config.steps, args.config.dtype) == (
        "tiny",
        128,
        128,
        4,
        "float32",
    )
    assert args.config.sizes == ()  # the bench serves one size
    monkeypatch.setenv("SDXL_STEPS", "3")
    assert bench_args(["--height", "64"]).config.steps == 3 and bench_args(["--height", "64"]).config.height == 64
    assert "default tiny" in _flags(bench_parser())["--model"].help


def test_the_app_reads_env_and_the_flag_wins(monkeypatch):
    monkeypatch.setenv("SDXL_MODEL", "tiny")
    monkeypatch.setenv("SDXL_STEPS", "3")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "9000")
    args = parse_args(["--port", "9001"])
    config = args.config
    assert (config.model, config.steps, args.port, args.host) == ("tiny", 3, 9001, "127.0.0.1")
    assert (config.height, config.width, args.queue_size, args.share) == (128, 128, 20, False)
    monkeypatch.delenv("SDXL_MODEL")
    config = parse_args([]).config
    assert (config.model, config.height, config.width) == ("stabilityai/stable-diffusion-xl-base-1.0", 1024, 1024)


def test_one_place_defines_the_shape_per_model():
    assert shape_defaults("tiny") == (128, 128, 4)
    assert shape_defaults(SDXL_BASE) == (1024, 1024, 25)
    config = parse_args(["--model", "tiny", "--steps", "3"]).config
    assert (config.height, config.width, config.steps) == (128, 128, 3)


def test_environment_and_mixed_size_flags(monkeypatch, capsys):
    monkeypatch.setenv("SDXL_STEPS", "3")
    assert parse_args(["--model", "tiny"]).config.steps == 3
    assert engine_config(_generate_parser().parse_args(["--prompt", "x", "--out", "o"])).steps == 3  # the CLI too
    args = parse_args(["--model", "tiny", "--no-compilation-cache"])
    assert args.no_compilation_cache is True and args.config.compilation_cache is False
    for argv, message in (
        (["--sizes", "1024x1024", "--height", "64"], "--sizes and --height/--width do not go together"),
        (["--sizes", "136x136"], "Each side of a size must be a multiple of 32 from 32 to 4096; got 136x136."),
        (["--port", "70000"], "argument --port: must be from 1 to 65535; got 70000"),
    ):
        with pytest.raises(SystemExit) as info:
            parse_args(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and message in err, argv
        # One line: "app.py: error: <message> (see app.py --help)", no usage block.
        assert err.count("\n") == 1 and err.startswith("app.py: error: ") and err.endswith(" (see app.py --help)\n")
    monkeypatch.setenv("SDXL_DTYPE", "float16")
    with pytest.raises(SystemExit):
        parse_args([])
    assert "SDXL_DTYPE='float16': choose one of bfloat16, float32" in capsys.readouterr().err


def test_sizes_flags(monkeypatch):
    args = parse_args(["--model", "tiny"])
    assert args.config.sizes == ((128, 128), (128, 224), (224, 128)) and args.no_progress is False  # 1:1, 16:9, 9:16
    assert len(parse_args(["--model", "tiny", "--sizes", "sdxl"]).config.sizes) == 9
    one = parse_args(["--model", "tiny", "--height", "96"]).config  # --height/--width alone: one size
    assert one.sizes == () and one.offered_sizes == ((96, 128),)
    monkeypatch.setenv("SDXL_SIZES", "1024x1024,1344x768")
    assert parse_args(["--no-progress"]).config.sizes == ((1024, 1024), (768, 1344))
    assert parse_args(["--no-progress"]).no_progress is True
    with pytest.raises(SystemExit):
        parse_args(["--sizes", "1344by768"])


def test_unet_and_variant_from_flags_and_environment(monkeypatch):
    from conftest import FIXTURES

    monkeypatch.setenv("SDXL_UNET", "ByteDance/SDXL-Lightning:sdxl_lightning_4step_unet.safetensors")
    monkeypatch.setenv("SDXL_VARIANT", "fp16")
    config = parse_args(["--model", str(FIXTURES / "tiny-pt")]).config
    assert (config.unet, config.variant) == ("ByteDance/SDXL-Lightning:sdxl_lightning_4step_unet.safetensors", "fp16")
    assert parse_args(["--unet", "unet.safetensors"]).config.unet == "unet.safetensors"


def test_images_per_device_and_its_older_names(monkeypatch, capsys):
    """`--images-per-device N` (SDXL_IMAGES_PER_DEVICE) in the app, the CLI and precompile; an old script's
    `--per-device-batch` and SDXL_PER_DEVICE_BATCH still work (the new variable wins); 0 is one line."""
    for name in ("SDXL_IMAGES_PER_DEVICE", "SDXL_PER_DEVICE_BATCH"):
        monkeypatch.delenv(name, raising=False)
    cli = ["--prompt", "x", "--out", "o"]
    assert parse_args(["--model", "tiny"]).config.per_device_batch == 1
    assert parse_args(["--model", "tiny", "--images-per-device", "2"]).config.per_device_batch == 2
    assert parse_args(["--model", "tiny", "--per-device-batch", "3"]).config.per_device_batch == 3
    assert engine_config(_generate_parser().parse_args([*cli, "--images-per-device", "4"])).per_device_batch == 4
    assert (
        engine_config(_subparser("precompile").parse_args(["--out", "o", "--per-device-batch", "2"])).per_device_batch
        == 2
    )
    monkeypatch.setenv("SDXL_PER_DEVICE_BATCH", "2")
    assert parse_args(["--model", "tiny"]).config.per_device_batch == 2
    assert engine_config(_generate_parser().parse_args(cli)).per_device_batch == 2
    monkeypatch.setenv("SDXL_IMAGES_PER_DEVICE", "3")
    assert parse_args(["--model", "tiny"]).config.per_device_batch == 3
    assert parse_args(["--model", "tiny", "--images-per-device", "1"]).config.per_device_batch == 1  # the flag wins
    action = _flags(app_parser())["--images-per-device"]  # --help names the older spellings from the row itself
    assert action.option_strings == ["--images-per-device", "--per-device-batch"]
    assert "[SDXL_IMAGES_PER_DEVICE or SDXL_PER_DEVICE_BATCH; default 1]" in action.help
    row = next(line for line in options.markdown_table(ALL_OPTIONS).splitlines() if "--images-per-device" in line)
    assert "(or `SDXL_PER_DEVICE_BATCH`)" in row and "(also `--per-device-batch`)" in row
    with pytest.raises(SystemExit) as info:
        parse_args(["--model", "tiny", "--images-per-device", "0"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "must be 1 or more; got 0" in err


def test_app_takes_precompiled_option():
    assert parse_args(["--model", "tiny", "--precompiled", "/tmp/x"]).precompiled == "/tmp/x"


def test_binds_loopback_and_no_share_link_by_default():
    args = parse_args([])
    assert args.host == "127.0.0.1" and args.share is False


def test_auth_from_flags_file_and_environment(tmp_path, monkeypatch):
    logins = tmp_path / "logins.txt"
    logins.write_text("# team\nada:pa ss\n\nbob:x:y\n", encoding="utf-8")
    args = parse_args(["--model", "tiny", "--auth", "cy:1", "--auth-file", str(logins)])
    assert args.auth == [("cy", "1"), ("ada", "pa ss"), ("bob", "x:y")]
    monkeypatch.setenv("SDXL_AUTH", "env:pw")
    assert parse_args(["--model", "tiny"]).auth == [("env", "pw")]
    assert parse_args(["--model", "tiny", "--auth", "flag:wins"]).auth == [("flag", "wins")]
    monkeypatch.delenv("SDXL_AUTH")
    assert parse_args(["--model", "tiny"]).auth == []
    with pytest.raises(ValueError, match="login 1: expected USER:PASSWORD") as info:
        read_auth(["nopassword-here"])
    assert "nopassword-here" not in str(info.value)


def test_engine_defaults_are_declared_once():
    """An engine setting's default lives in EngineConfig alone: a program without the option (an empty namespace)
    gets it, and the option that sets it offers the same default (issue 49: lora_cache, prompt_windows, attention,
    emphasis, quantize and per_device_batch were declared three times)."""
    from pipeline.config import GIVEN_OR_DEFAULT, OPTION_OF, EngineConfig

    built = engine_config(argparse.Namespace(model="tiny"))
    for name in GIVEN_OR_DEFAULT:
        default = EngineConfig.__dataclass_fields__[name].default
        assert getattr(built, name) == default, name
        flagged = [o for o in options.OPTIONS if o.flag == "--" + OPTION_OF.get(name, name).replace("_", "-")]
        assert len(flagged) == 1 and flagged[0].default == default, name


def test_xla_options_from_flags_and_environment(monkeypatch, capsys):
    """`--xla-option NAME=VALUE` (repeated) in the app, the CLI and precompile, else SDXL_XLA_OPTIONS' comma-separated
    pairs; the flag wins, a name given twice keeps its last value, and a pair without "=" is one line, status 2."""
    monkeypatch.delenv("SDXL_XLA_OPTIONS", raising=False)
    assert parse_args(["--model", "tiny"]).config.xla_options == ()
    flags = ["--xla-option", "xla_gpu_dot_merger_threshold_mb=0", "--xla-option", "xla_gpu_enable_triton_gemm=false"]
    expected = (("xla_gpu_dot_merger_threshold_mb", "0"), ("xla_gpu_enable_triton_gemm", "false"))
    assert parse_args(["--model", "tiny", *flags]).config.xla_options == expected
    cli = ["--prompt", "x", "--out", "o", *flags]
    assert engine_config(_generate_parser().parse_args(cli)).xla_options == expected
    assert engine_config(_subparser("precompile").parse_args(["--out", "o", *flags])).xla_options == expected
    monkeypatch.setenv(
        "SDXL_XLA_OPTIONS",
        " xla_gpu_enable_triton_gemm=false , xla_gpu_autotune_level=0,xla_gpu_enable_triton_gemm=true",
    )
    assert parse_args(["--model", "tiny"]).config.xla_options == (
        ("xla_gpu_autotune_level", "0"),
        ("xla_gpu_enable_triton_gemm", "true"),
    )
    assert parse_args(["--model", "tiny", *flags[:2]]).config.xla_options == expected[:1]  # the flag wins
    for bad, says in (("xla_gpu_enable_triton_gemm", "takes NAME=VALUE"), ("gpu_thing=1", "looks like xla_")):
        with pytest.raises(SystemExit) as info:
            parse_args(["--model", "tiny", "--xla-option", bad])
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1 and says in err, err
    assert "NAME=VALUE" in _flags(app_parser())["--xla-option"].help
