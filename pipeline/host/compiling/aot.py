"""Ahead of time: the served programs compiled for a TPU topology on any host, and precompiled start-up.

    devices = topology_devices("v5e:2x2")            # 4 "TPU v5 lite" devices, no TPU needed (libtpu installed)
    programs = ServedPrograms(modules, abstract_params, data_mesh(devices), ...)
    compiled = programs.compile_lowered(programs.lower(key))   # the real TPU compiler, on this CPU host

    save_precompiled(programs, keys, "precompiled/", topology="v5e:2x2")      # pipeline/precompile.py
    load_precompiled(programs, keys, "precompiled/")  # app.py --precompiled: installs those that match

A precompiled directory holds one serialized executable per program (`jax.experimental.serialize_executable`)
and `manifest.json`: program keys, topology, device kind and count, jax/jaxlib/libtpu versions, and a fingerprint
of what each program is compiled from (`fingerprint`). A server loads an executable only when all of these match
what it would compile itself (so a changed model, attention core, shape, code or library never runs stale code) and
compiles the rest as usual.
`--topology cpu` means this host's own CPU devices (the round trip the tests check); a TPU topology's executables
are for a TPU host with that many chips of that kind.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import pickle
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import jax
from jax.experimental import topologies
from jax.experimental.serialize_executable import deserialize_and_load, serialize

from .cache_reads import serialize_with_bytes
from .programs import KINDS, STEP_KINDS, WEIGHTS, ProgramKey, ServedPrograms

logger = logging.getLogger(__name__)

#: `--topology` value meaning this host's own (CPU) devices.
LOCAL_CPU = "cpu"
MANIFEST = "manifest.json"
FORMAT = 1


def topology_devices(name: str) -> list:
    """The devices of TPU topology `name` (e.g. "v5e:2x2", "v6e:2x2", "v5e:4x4"), or this host's CPU devices for
    "cpu". A TPU topology needs libtpu (`pip install "jax[tpu]"`), not a TPU; a multi-host one gives every host's
    chips."""
    if name == LOCAL_CPU:
        return jax.devices("cpu")
    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
    except Exception as exc:  # no libtpu, or a name it does not know: one clear line
        raise ValueError(
            f"cannot describe TPU topology {name!r} ({type(exc).__name__}: {exc}); "
            'install libtpu (pip install "jax[tpu]==0.10.2") and use e.g. v5e:2x2'
        ) from None


def versions() -> dict[str, str | None]:
    """jax, jaxlib and libtpu versions (an executable only runs under the ones that built it), and flax's, whose
    layers the project's networks are built from (the networks themselves are this project's code: its version)."""
    found: dict[str, str | None] = {}
    for name in ("jax", "jaxlib", "libtpu", "flax"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def build_environment() -> dict:
    """What decides an executable besides its program: the library versions and the compiler flags of this process
    (the executable store's folder and a compile turn's name both hash it)."""
    return {
        "versions": versions(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS", ""),
    }


# ---- precompiled start-up -------------------------------------------------------------------------------------------


#: The sources that define what the served programs compute: an executable built from other code is not loaded.
#: The networks (`device/nets/`) are the project's code too, so every file there counts (no library version does).
PROGRAM_SOURCES = (
    "host/compiling/programs.py",
    "device/denoise.py",
    "device/deepcache.py",
    "device/lora.py",
    "device/sampler_update.py",
    "device/text.py",
    "device/vae.py",
    "device/vae_tiles.py",
    "device/modules.py",
    "device/attention.py",
    "device/sharding.py",
    "device/preview.py",
    "device/quantize.py",
    "device/controlnet_step.py",
    "device/refiner_step.py",
    "device/step_block.py",
    "device/nets/*.py",
)


#: Settings of `ServedPrograms` that do not shape a kind's program, so servers differing only in them share its
#: executable (a program that JAX's cache holds but the store does not is compiled once more to be stored); any other
#: setting, a new one included, is in every program's fingerprint.
NOT_SHAPING: dict[str, frozenset[str]] = {
    "levers": frozenset(KINDS),  # which programs exist (their kinds), not what one computes
    "prediction_type": frozenset(KINDS) - {"step", "step_control", "step_full", "step_shallow", "refiner_step"},
    "prompt_windows": frozenset(KINDS)
    - {"encode", "halve_text", "step", "step_control", "step_full", "step_shallow", "refiner_encode", "refiner_step"},
    "attention": frozenset({"merge", "start", "preview", "halve_text", "halve_feature"}),  # no attention in them
    "cfg": frozenset(KINDS) - {"refiner_step"},  # the server's guidance: the refiner's text rows only
    "refiner_zero_negative": frozenset(KINDS) - {"refiner_encode"},
    "vae_tile_above": frozenset(KINDS) - {"decode", "encode_image"},  # the VAE's programs only (whole or tiled)
    "rows_per_call": frozenset(KINDS) - set(STEP_KINDS),  # the steps' rows per call
}


def fingerprint(programs: ServedPrograms, key: ProgramKey) -> str:
    """A hash of everything `key`'s program is compiled from, without tracing it (a start-up must stay fast):
    the key, the devices, the static settings of `programs` that shape it (batch, attention core, prediction type,
    prompt windows...), the configs and computation dtypes of the modules it runs, the shapes and dtypes of its
    weights, and the source files that define the programs. Equal hashes mean the same program."""
    digest = hashlib.sha256()
    first = next(iter(programs.mesh.devices.flat))
    static = (
        key.label,
        int(programs.mesh.devices.size),
        first.platform,
        first.device_kind,
        _static_settings(programs, key.kind),
    )
    digest.update(repr(static).encode())
    if key.nets is not None:  # each unit's ControlNet architecture (its fields; shapes alone miss a few)
        digest.update(repr([programs.modules.controlnets[i] for i in key.nets]).encode())
    for name in WEIGHTS[key.kind] or ("text_encoder", "text_encoder_2", "unet", "vae"):  # none: shapes from all
        if name == "ip_adapters":  # the adapters' projections (their weights' shapes follow below)
            digest.update(repr([p.config for p in programs.modules.image_projections]).encode())
            continue
        module = getattr(programs.modules, name)
        digest.update(f"{_config_text(module)} {getattr(module, 'dtype', None)}".encode())  # computation dtype
    if key.image_tokens:  # a step reading an image prompt: its slots' adapters ([A, S]) shape its arguments
        digest.update(repr(len(programs.modules.image_projections)).encode())
    digest.update(repr(programs.modules.vae_scale_factor).encode())
    if key.kind == "merge":  # its arguments are the LoRAs' kernels and slots, not a component's weights
        digest.update(
            repr(
                (
                    programs.lora_layout,
                    jax.tree_util.tree_map(lambda x: (x.shape, str(x.dtype)), programs.abstract_args(key)),
                )
            ).encode()
        )
    leaves = jax.tree_util.tree_flatten_with_path(programs.weights(key, programs._params))[0]
    digest.update(repr([(jax.tree_util.keystr(path), leaf.shape, str(leaf.dtype)) for path, leaf in leaves]).encode())
    digest.update(sources_hash().encode())
    return digest.hexdigest()[:20]


def _static_settings(programs: ServedPrograms, kind: str) -> tuple:
    """`programs`' plain settings (numbers, names, switches, tuples of them) that shape `kind`'s program, whatever
    they are called: a setting added to `ServedPrograms` joins every fingerprint without a change here."""
    plain = (bool, int, float, str, tuple, type(None))
    return tuple(
        (name, value)
        for name, value in sorted(vars(programs).items())
        if not name.startswith("_") and isinstance(value, plain) and kind not in NOT_SHAPING.get(name, ())
    )


@functools.cache
def sources_hash() -> str:
    """A hash of the source files that define what the served programs compute (read once per process)."""
    here = Path(__file__).resolve().parent.parent  # pipeline/
    digest = hashlib.sha256()
    for pattern in PROGRAM_SOURCES:
        for path in sorted(here.glob(pattern)):
            digest.update(path.relative_to(here).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:20]


def _config_text(module) -> str:
    """A module's config as sorted text, without bookkeeping fields (paths, library versions)."""
    config = getattr(module, "config", None)
    if config is None:
        return "none"
    items = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    skip = ("_name_or_path", "transformers_version", "_diffusers_version", "_commit_hash")
    return json.dumps(
        {k: v for k, v in items.items() if k not in skip and not k.startswith("_")}, sort_keys=True, default=repr
    )


def _file_name(key: ProgramKey, program_fingerprint: str) -> str:
    """One file per program version: several versions of one label (other models, sizes or settings) can share a
    directory (the executable store, host/compiling/executable_store.py)."""
    return f"{key.label.replace(' ', '_')}-{program_fingerprint}.jaxexe"


def serialized_entry(
    programs: ServedPrograms,
    key: ProgramKey,
    compiled: jax.stages.Compiled,
    directory: Path,
    executable_bytes: bytes | None = None,
) -> dict:
    """Write `compiled` (`key`'s program) into `directory` as one file; its manifest entry. `executable_bytes`: its
    executable as JAX's persistent cache holds it, for one the cache served (host/compiling/cache_reads.py).

    The file is written under a temporary name and renamed, so a reader (another process starting) never sees half
    of it. Raises what serialization raises (a program holding a host callback or a constant cannot be written).
    """
    program_fingerprint = fingerprint(programs, key)
    payload = serialize(compiled) if executable_bytes is None else serialize_with_bytes(compiled, executable_bytes)
    blob = pickle.dumps(payload)  # (executable bytes, argument tree, result tree)
    name = _file_name(key, program_fingerprint)
    write_atomically(directory / name, blob)
    return {
        **_key_fields(key),
        "label": key.label,
        "file": name,
        "bytes": len(blob),
        "fingerprint": program_fingerprint,
        "sources": sources_hash(),
    }


def write_atomically(path: Path, data: bytes) -> None:
    """`path` holds `data` whole or keeps what it held: written beside it, then renamed over it."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def manifest_header(programs: ServedPrograms, *, topology: str, settings: dict) -> dict:
    """What every executable of a directory was built for: the devices and the libraries' versions."""
    first = next(iter(programs.mesh.devices.flat))
    return {
        "format": FORMAT,
        "topology": topology,
        "platform": first.platform,
        "device_kind": first.device_kind,
        "device_count": int(programs.mesh.devices.size),
        "images_per_device": images_per_device(programs),
        "versions": versions(),
        "attention": programs.attention,
        "settings": settings,  # what the server was asked for (informational)
    }


def write_manifest(directory: Path, header: dict, entries: list[dict]) -> dict:
    manifest = {**header, "programs": entries, "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_atomically(directory / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    return manifest


def call_size_directory(directory: str | Path, images_per_device: int) -> Path:
    """Where a precompiled directory keeps the programs of --merge-requests' smaller calls (each size its own
    manifest): `images-per-device-N` inside it."""
    return Path(directory) / f"images-per-device-{images_per_device}"


def save_precompiled(
    programs: ServedPrograms,
    keys: list[ProgramKey],
    directory: str | Path,
    *,
    topology: str,
    settings: dict,
    progress=logger.info,
) -> dict:
    """Compile `keys` for `programs`' mesh and write each serialized executable plus `manifest.json`; the manifest.

    Compiled here and now, never taken from JAX's persistent cache: an XLA:CPU executable the cache loaded serializes
    without its kernels ("Function ... not found" when the copy runs), and a TPU topology's compile-only client
    cannot read the cache at all. Call it with the cache off (`precompile` turns it off).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for key in keys:
        started = time.perf_counter()
        entry = serialized_entry(programs, key, programs.compile_lowered(programs.lower(key)), directory)
        seconds = time.perf_counter() - started
        entries.append({**entry, "compile_s": round(seconds, 2)})
        progress(f"precompiled {key.label} in {seconds:.1f} s ({entry['bytes'] / 2**20:.1f} MiB)")
    return write_manifest(directory, manifest_header(programs, topology=topology, settings=settings), entries)


def _key_fields(key: ProgramKey) -> dict:
    return {"kind": key.kind, "height": key.height, "width": key.width, "cfg": key.cfg}


@dataclass
class LoadReport:
    """What `load_precompiled` did: labels loaded, and labels left to compile with the reason."""

    loaded: list[str] = field(default_factory=list)
    compile: dict[str, str] = field(default_factory=dict)  # label -> why it is compiled here
    seconds: float = 0.0

    def summary(self, directory, what: str = "precompiled") -> str:
        """One line: which programs were loaded and which are compiled, and why."""
        total = len(self.loaded) + len(self.compile)
        line = f"{what} {directory}: loaded {len(self.loaded)} of {total} programs in {self.seconds:.1f} s"
        if self.compile:
            reasons: dict[str, list[str]] = {}
            for label, why in self.compile.items():
                reasons.setdefault(why, []).append(label)
            line += "; compiling " + "; ".join(f"{', '.join(labels)} ({why})" for why, labels in reasons.items())
        return line


#: Why a program is compiled when the directory has no executable of it.
NOT_IN_MANIFEST = "not in the manifest"


def read_manifest(directory: Path) -> dict:
    """`directory`'s manifest; raises OSError or ValueError when it is missing or unreadable."""
    manifest = json.loads((directory / MANIFEST).read_text())
    if not isinstance(manifest, dict):
        raise ValueError("not a JSON object")
    return manifest


def images_per_device(programs: ServedPrograms) -> int:
    """Images each device makes per call (`--images-per-device`)."""
    return programs.batch // int(programs.mesh.devices.size)


def manifest_mismatch(manifest: dict, programs: ServedPrograms) -> str | None:
    """Why `manifest`'s executables cannot run on `programs`' devices and libraries, or make another number of images
    per device (None: they can)."""
    first = next(iter(programs.mesh.devices.flat))
    here = {
        "format": FORMAT,
        "device_kind": first.device_kind,
        "device_count": int(programs.mesh.devices.size),
        "versions": versions(),
    }
    for name, value in here.items():
        if manifest.get(name) != value:
            return f"built for {name} {manifest.get(name)}, this server has {value}"
    # Older manifests say it among their settings only.
    built = manifest.get("images_per_device", (manifest.get("settings") or {}).get("per_device_batch", 1))
    if built != images_per_device(programs):
        return f"built for --images-per-device {built}, this server has {images_per_device(programs)}"
    return None


def load_precompiled(
    programs: ServedPrograms, keys: list[ProgramKey], directory: str | Path, *, what: str = "precompiled"
) -> LoadReport:
    """Install the executables in `directory` that match `programs` (devices, versions, program text) for `keys`.

    Nothing raises for a mismatch: such programs are left for the usual compilation, and the report (logged as one
    line, named `what`) says why.
    """
    started = time.perf_counter()
    directory = Path(directory)
    report = LoadReport()
    try:
        manifest = read_manifest(directory)
    except (OSError, ValueError) as exc:
        report.compile = {key.label: f"no readable {MANIFEST}: {type(exc).__name__}" for key in keys}
        return _logged(report, directory, started, what)
    if why := manifest_mismatch(manifest, programs):
        report.compile = {key.label: why for key in keys}
        return _logged(report, directory, started, what)
    entries = {entry.get("fingerprint"): entry for entry in manifest.get("programs", []) if isinstance(entry, dict)}
    labels = {entry.get("label") for entry in entries.values()}
    for key in keys:
        entry = entries.get(fingerprint(programs, key))
        if entry is None:
            report.compile[key.label] = (
                "program differs (model, settings or code changed)" if key.label in labels else NOT_IN_MANIFEST
            )
            continue
        try:
            blob, in_tree, out_tree = pickle.loads((directory / entry["file"]).read_bytes())
            compiled = deserialize_and_load(blob, in_tree, out_tree, execution_devices=list(programs.mesh.devices.flat))
        except Exception as exc:  # a truncated file, a runtime that refuses it: compile instead
            report.compile[key.label] = f"could not load: {type(exc).__name__}: {str(exc)[:80]}"
            continue
        programs.install(key, compiled)
        report.loaded.append(key.label)
    return _logged(report, directory, started, what)


def _logged(report: LoadReport, directory, started: float, what: str) -> LoadReport:
    report.seconds = time.perf_counter() - started
    logger.info("%s", report.summary(directory, what))
    return report
