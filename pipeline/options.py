"""Every command-line option of the app (`app.py`) and the CLI (`python -m pipeline generate`), in one table.

Both parsers are built from OPTIONS, so an option's flag, environment variable, type, default and help are written
once, and the next option is one line. The environment variable is read by whichever program takes the option;
the flag wins. Kept free of JAX (the app imports it).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

from .presets import PRESET_NAMES
from .samplers import PREDICTION_TYPES, SAMPLER_NAMES, SPACINGS, sampler_id, sampler_label
from .settings import ATTENTIONS, DTYPES, SDXL_BASE
from .styles import DEFAULT_STYLE
from .validation import GUIDANCE_MAX, GUIDANCE_MIN, MAX_STEPS, InvalidInput

APP, CLI = "app", "cli"
BOTH = frozenset({APP, CLI})
#: Requests that may wait in the app's queue by default.
DEFAULT_QUEUE_SIZE = 20
#: Truthy spellings of a switch's environment variable (SDXL_NO_CFG=1).
TRUE_WORDS = ("1", "true", "yes", "on")
#: The multi-host group's title in --help.
CLUSTER_GROUP = "multi-host (jax.distributed)"


def _bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` (to `high`); the error names the allowed range."""

    def parse(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number; got {text!r}") from None
        if value < low or (high is not None and value > high):
            allowed = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"must be {allowed}; got {value}")
        return value

    parse.__name__ = "int"
    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive; got {value:g}")
    return value


_positive_float.__name__ = "float"


def sampler_argument(text: str) -> str:
    """argparse type of --sampler: A1111's names (any case) or the engine's ids, kept as A1111's name."""
    try:
        return sampler_label(sampler_id(text))
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


sampler_argument.__name__ = "sampler"


@dataclass(frozen=True)
class Option:
    """One option: its flag, where it applies, and how it is read."""

    flag: str  # the long flag, e.g. "--model"; the argparse dest is its name with "_" for "-"
    help: str  # one line for --help and the README; the env variable and default are appended
    env: str | None = None  # environment variable read when the flag is absent (None: flag only)
    type: Callable[[str], object] | None = None  # argparse type (None: the text as given)
    default: object = None  # value when neither flag nor env is set; None = resolved later (per model/platform)
    default_text: str = ""  # what --help says about a default resolved later, e.g. "1024, 128 for tiny"
    choices: tuple[str, ...] = ()  # allowed values (checked for the env variable too)
    kind: str = "value"  # "value", "switch" (store_true; env: 1/true/yes) or "append" (repeatable)
    programs: frozenset[str] = BOTH  # which programs take it: "app", "cli"
    metavar: str | None = None  # placeholder in --help
    required: bool = False  # the CLI's --prompt and --out
    group: str = ""  # an argparse group title ("" = the main list)
    env_text: str = ""  # overrides the "[ENV; default ...]" note when the env variable is read specially

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def note(self) -> str:
        """The bracketed note --help appends: env variable and default."""
        if self.env_text:
            return f" [{self.env_text}]"
        default = self.default_text or ("" if self.default in (None, False, []) else str(self.default))
        parts = [self.env or ""] + ([f"default {default}"] if default else [])
        text = "; ".join(p for p in parts if p)
        return f" [{text}]" if text else ""


_PORT = _bounded_int(1, 65535)
_STEPS = _bounded_int(1, MAX_STEPS)
_AT_LEAST_ONE = _bounded_int(1)
_NON_NEGATIVE = _bounded_int(0)

#: The table. Order is the order of --help.
OPTIONS: tuple[Option, ...] = (
    # -- the model
    Option("--model", "Hub id, local diffusers directory (Flax or PyTorch safetensors), or 'tiny'", "SDXL_MODEL",
           default_text=SDXL_BASE),
    Option("--revision", "Hub revision (branch, tag or commit)", default_text="refs/pr/95 for SDXL base",
           programs=frozenset({CLI})),
    Option("--variant", "PyTorch weight variant, e.g. fp16 (*.fp16.safetensors)", "SDXL_VARIANT"),
    Option("--unet", "whole-UNet .safetensors replacing the model's: PATH or REPO:FILE", "SDXL_UNET"),
    Option("--preset", "few-step recipe (assets/presets.json): model, UNet file, steps, sampler, spacing, guidance, "
           "size; flags override it; with another model (e.g. tiny) only its sampler settings", "SDXL_PRESET",
           choices=PRESET_NAMES),
    # -- the shape of the compiled program
    Option("--height", "image height in pixels, a multiple of 32", "SDXL_HEIGHT", int,
           default_text="1024, 128 for tiny"),
    Option("--width", "image width in pixels, a multiple of 32", "SDXL_WIDTH", int,
           default_text="1024, 128 for tiny"),
    Option("--sizes", "offered sizes, each compiled at start-up, the first the default; each side a multiple of 32; "
           "'sdxl' = SDXL's 9 trained sizes; not with --height/--width", "SDXL_SIZES", metavar="WxH,WxH,...",
           default_text="1024x1024,1344x768,768x1344 (the same ratios at ~128 px for tiny; --height/--width: that "
           "one size)", programs=frozenset({APP})),
    Option("--steps", f"denoising steps of a request that names none (a request may ask for 1..{MAX_STEPS}; no "
           "recompile)", "SDXL_STEPS", _STEPS, default_text="25, 4 for tiny"),
    Option("--dtype", "network dtype", "SDXL_DTYPE", choices=DTYPES,
           default_text="bfloat16 on TPU/GPU, float32 on CPU"),
    Option("--per-device-batch", "images per device per request", "SDXL_PER_DEVICE_BATCH", _AT_LEAST_ONE, 1),
    Option("--attention", "UNet attention core: auto = splash on TPU, cudnn on NVIDIA (bf16), xla elsewhere",
           "SDXL_ATTENTION", choices=ATTENTIONS, default="auto"),
    Option("--no-progress", "no live step progress on the page (reported by the host between steps; the programs "
           "are the same)", "SDXL_NO_PROGRESS", kind="switch", programs=frozenset({APP})),
    Option("--no-compilation-cache", "do not use JAX's persistent compilation cache (every start compiles)",
           "SDXL_NO_COMPILATION_CACHE", kind="switch"),
    Option("--cpu-devices", "CPU only: JAX devices to split the CPU into, one image each per request; 0 = one device",
           "SDXL_CPU_DEVICES", _NON_NEGATIVE, default_text="one per core", metavar="N"),
    Option("--precompiled", "load the matching executables written by `python -m pipeline precompile` from DIR; "
           "compile the rest (one line says which and why)", "SDXL_PRECOMPILED", metavar="DIR"),
    # -- the sampler (the checkpoint's scheduler config unless set)
    Option("--sampler", f"sampler of a request that names none: {', '.join(SAMPLER_NAMES)} (a request may pick "
           "another; no recompile)", "SDXL_SAMPLER", sampler_argument, default_text="the checkpoint's"),
    Option("--timestep-spacing", "timestep spacing", "SDXL_TIMESTEP_SPACING", choices=SPACINGS,
           default_text="the checkpoint's"),
    Option("--steps-offset", "added to leading timesteps", "SDXL_STEPS_OFFSET", int,
           default_text="the checkpoint's"),
    Option("--prediction-type", "what the UNet predicts", "SDXL_PREDICTION_TYPE", choices=PREDICTION_TYPES,
           default_text="the checkpoint's"),
    Option("--no-cfg", "guidance-free program: the UNet runs on the prompt only; guidance and negative prompt are "
           "ignored (hidden on the page)", "SDXL_NO_CFG", kind="switch"),
    # -- the web server (app only)
    Option("--host", "interface to bind; 0.0.0.0 to accept remote connections", "GRADIO_SERVER_NAME",
           default="127.0.0.1", programs=frozenset({APP})),
    Option("--port", "port to listen on (checked before the model loads)", "GRADIO_SERVER_PORT", _PORT, 7860,
           programs=frozenset({APP})),
    Option("--queue-size", "requests that may wait; more are turned away as busy", "SDXL_QUEUE_SIZE", _AT_LEAST_ONE,
           DEFAULT_QUEUE_SIZE, programs=frozenset({APP})),
    Option("--prompt-filter", "block list, one word or phrase a line (see assets/blocked_words.example.txt)",
           "SDXL_PROMPT_FILTER", metavar="FILE", programs=frozenset({APP})),
    Option("--auth", "require this login (repeat for more users)", "SDXL_AUTH", kind="append",
           metavar="USER:PASSWORD", programs=frozenset({APP}), env_text="SDXL_AUTH: one USER:PASSWORD"),
    Option("--auth-file", "require a login from this file, one USER:PASSWORD a line", "SDXL_AUTH_FILE",
           metavar="FILE", programs=frozenset({APP})),
    Option("--share", "also open a public *.gradio.live link (needs internet)", kind="switch",
           programs=frozenset({APP})),
    # -- one request (CLI only)
    Option("--prompt", "what to draw", required=True, programs=frozenset({CLI})),
    Option("--negative-prompt", "what to keep out", default="", programs=frozenset({CLI})),
    Option("--style", "preset from assets/styles.json", default=DEFAULT_STYLE, programs=frozenset({CLI})),
    Option("--seed", "0..4294967295, or 'random'", default="0", programs=frozenset({CLI})),
    Option("--guidance-scale", f"{GUIDANCE_MIN:g}..{GUIDANCE_MAX:g}", type=float, default_text="5",
           programs=frozenset({CLI})),
    Option("--out", "directory for the PNG files", required=True, programs=frozenset({CLI})),
    Option("--json", "print a JSON summary instead of text", kind="switch", programs=frozenset({CLI})),
    # -- several processes
    Option("--distributed", "join a multi-host run detected by JAX (Cloud TPU slice, SLURM, Open MPI); automatic "
           "where the environment names several processes", "SDXL_DISTRIBUTED", kind="switch", group=CLUSTER_GROUP),
    Option("--coordinator-address", "address of process 0, reachable from every process (one machine: "
           "127.0.0.1:PORT)", "SDXL_COORDINATOR_ADDRESS", metavar="HOST:PORT", group=CLUSTER_GROUP),
    Option("--num-processes", "processes in the run", "SDXL_NUM_PROCESSES", _AT_LEAST_ONE, group=CLUSTER_GROUP),
    Option("--process-id", "this process, 0 .. num-processes - 1; 0 serves the page", "SDXL_PROCESS_ID",
           _NON_NEGATIVE, group=CLUSTER_GROUP),
    Option("--cluster-timeout", "seconds for all processes to join, and per request", "SDXL_CLUSTER_TIMEOUT",
           _positive_float, 300.0, group=CLUSTER_GROUP),
    Option("--heartbeat-timeout", "seconds of silence after which a process is taken for dead",
           "SDXL_HEARTBEAT_TIMEOUT", _positive_float, 30.0, group=CLUSTER_GROUP),
)  # fmt: skip


def options_for(program: str) -> list[Option]:
    """The options `program` ("app" or "cli") takes, in table order."""
    return [option for option in OPTIONS if program in option.programs]


def env_value(option: Option) -> str | None:
    """The option's environment variable, if set and non-empty."""
    value = os.environ.get(option.env) if option.env else None
    return value if value not in (None, "") else None


def add_options(parser: argparse.ArgumentParser, program: str) -> None:
    """Add `program`'s options to `parser`, each defaulting to its environment variable, then the table's default."""
    groups: dict[str, argparse._ActionsContainer] = {"": parser}
    for option in options_for(program):
        if option.group not in groups:
            groups[option.group] = parser.add_argument_group(option.group)
        add = groups[option.group].add_argument
        env = env_value(option) if option.kind != "append" else None  # --auth reads SDXL_AUTH itself
        help_text = option.help + option.note()
        if option.kind == "switch":
            default = env.strip().lower() in TRUE_WORDS if env is not None else bool(option.default)
            add(option.flag, action="store_true", default=default, help=help_text)
        elif option.kind == "append":
            add(option.flag, action="append", default=[], metavar=option.metavar, help=help_text)
        else:
            kwargs: dict = {"default": env if env is not None else option.default, "help": help_text}
            if option.type is not None:
                kwargs["type"] = option.type  # argparse applies it to a string default (the env value) too
            if option.choices:
                kwargs["choices"] = option.choices
            if option.metavar:
                kwargs["metavar"] = option.metavar
            if option.required:
                kwargs["required"] = True
            add(option.flag, **kwargs)


def check_env_choices(parser: argparse.ArgumentParser, args: argparse.Namespace, program: str) -> None:
    """argparse checks choices of flags only; an environment variable's value gets the same one-line refusal."""
    for option in options_for(program):
        value = getattr(args, option.dest, None)
        if option.choices and value is not None and value not in option.choices:
            parser.error(f"{option.env or option.flag}={value!r}: choose one of {', '.join(option.choices)}")


def _values(option: Option) -> str:
    if option.kind == "switch":
        return "switch" + (" (`=1`)" if option.env else "")
    if option.choices:
        return ", ".join(f"`{choice}`" for choice in option.choices)
    if option.type is _PORT:
        return "1–65535"
    if option.type is _STEPS:
        return f"1–{MAX_STEPS}"
    if option.type is sampler_argument:
        return ", ".join(f"`{name}`" for name in SAMPLER_NAMES)
    if option.type is _AT_LEAST_ONE:
        return "whole number ≥ 1"
    if option.type is _NON_NEGATIVE:
        return "whole number ≥ 0"
    return {int: "whole number", float: "number", _positive_float: "number > 0"}.get(option.type, "text")


def markdown_table() -> str:
    """The README's table of options (`python -m pipeline.options` prints it; a test keeps the README in step)."""
    rows = ["| Flag | Environment variable | Values | Default | Meaning | Taken by |", "|---|---|---|---|---|---|"]
    for option in OPTIONS:
        flag = option.flag + (f" {option.metavar}" if option.metavar else "")
        env = f"`{option.env}`" + (" (one pair)" if option.kind == "append" else "") if option.env else ""
        if option.required:
            default = "required"
        elif option.default_text:
            default = option.default_text
        else:
            default = "" if option.default in (None, False, "") else f"`{option.default:g}`" if isinstance(
                option.default, float) else f"`{option.default}`"  # fmt: skip
        programs = ", ".join(name if name == APP else "CLI" for name in (APP, CLI) if name in option.programs)
        rows.append(f"| `{flag}` | {env} | {_values(option)} | {default} | {option.help} | {programs} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
