"""Ahead of time: the served programs compiled for a TPU topology on any host, and precompiled start-up.

    devices = topology_devices("v5e:2x2")            # 4 "TPU v5 lite" devices, no TPU needed (libtpu installed)
    programs = ServedPrograms(modules, abstract_params, data_mesh(devices), ...)
    compiled = programs.lower(key).compile()        # the real TPU compiler, on this CPU host
    report = compiled_report(compiled)              # HBM per chip, FLOPs and bytes of the compiled program

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

import hashlib
import json
import logging
import pickle
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import jax

from .programs import ProgramKey, ServedPrograms

logger = logging.getLogger(__name__)

#: `--topology` value meaning this host's own (CPU) devices.
LOCAL_CPU = "cpu"
#: Topologies the report knows (any name libtpu accepts works): chips' kind and HBM per chip.
GiB = 2**30
HBM_PER_CHIP = {"TPU v5 lite": 16 * GiB, "TPU v6 lite": 32 * GiB}
#: Peak dense bf16 FLOP/s and HBM bandwidth (bytes/s) per chip (Google Cloud's TPU pages).
PEAK_FLOPS = {"TPU v5 lite": 197e12, "TPU v6 lite": 918e12}
HBM_BANDWIDTH = {"TPU v5 lite": 819e9, "TPU v6 lite": 1640e9}
MANIFEST = "manifest.json"
FORMAT = 1


def topology_devices(name: str) -> list:
    """The devices of TPU topology `name` (e.g. "v5e:2x2", "v6e:2x2", "v5e:4x4"), or this host's CPU devices for
    "cpu". A TPU topology needs libtpu (`pip install "jax[tpu]"`), not a TPU; a multi-host one gives every host's
    chips."""
    if name == LOCAL_CPU:
        return jax.devices("cpu")
    from jax.experimental import topologies

    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
    except Exception as exc:  # no libtpu, or a name it does not know: one clear line
        raise ValueError(f"cannot describe TPU topology {name!r} ({type(exc).__name__}: {exc}); "
                         'install libtpu (pip install "jax[tpu]==0.10.2") and use e.g. v5e:2x2') from None  # fmt: skip


def libtpu_available() -> bool:
    try:
        metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def versions() -> dict[str, str | None]:
    """jax, jaxlib and libtpu versions: an executable only runs under the ones that built it."""
    found: dict[str, str | None] = {}
    for name in ("jax", "jaxlib", "libtpu"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


# ---- what a compiled program costs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompiledCost:
    """Per chip: memory of a compiled program (XLA's memory analysis) and its cost (XLA's cost analysis)."""

    hbm_bytes: dict[str, int]  # arguments, temporaries, outputs, code
    flops: float  # of the compiled (fused, partitioned) program, per chip; fused kernels' own FLOPs are not counted
    bytes_accessed: float  # HBM traffic XLA expects, per chip

    @property
    def hbm_total(self) -> int:
        """Arguments + temporaries + outputs + code, less outputs that alias arguments (none in served programs)."""
        return sum(self.hbm_bytes.values())

    def roofline_s(self, device_kind: str) -> float | None:
        """max(FLOPs / peak, bytes / bandwidth) on `device_kind`: a lower bound on its run time; None if unknown."""
        if device_kind not in PEAK_FLOPS:
            return None
        return max(self.flops / PEAK_FLOPS[device_kind], self.bytes_accessed / HBM_BANDWIDTH[device_kind])


def compiled_cost(compiled: jax.stages.Compiled) -> CompiledCost:
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):  # older JAX: one dict per computation
        cost = cost[0]
    cost = cost or {}
    hbm = {
        "arguments": int(getattr(memory, "argument_size_in_bytes", 0)),
        "temporaries": int(getattr(memory, "temp_size_in_bytes", 0)),
        "outputs": int(getattr(memory, "output_size_in_bytes", 0)) - int(getattr(memory, "alias_size_in_bytes", 0)),
        "code": int(getattr(memory, "generated_code_size_in_bytes", 0)),
    }
    return CompiledCost(hbm, float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)))


# ---- precompiled start-up -------------------------------------------------------------------------------------------


#: The sources that define what the served programs compute: an executable built from other code is not loaded.
PROGRAM_SOURCES = ("host/programs.py", "device/denoise.py", "device/deepcache.py", "device/lora.py",
                   "device/sampler_update.py",
                   "device/text.py", "device/vae.py", "device/modules.py", "device/attention.py", "device/sharding.py",
                   "device/preview.py")


def fingerprint(programs: ServedPrograms, key: ProgramKey) -> str:
    """A hash of everything `key`'s program is compiled from, without tracing it (a start-up must stay fast):
    the key, batch, devices, attention core, prediction type, the modules' configs, the weights' shapes and dtypes,
    and the source files that define the programs. Equal hashes mean the same program."""
    digest = hashlib.sha256()
    first = next(iter(programs.mesh.devices.flat))
    static = (key.label, programs.batch, int(programs.mesh.devices.size), first.platform, first.device_kind,
              programs.attention, programs.prediction_type, programs.max_tokens)  # fmt: skip
    digest.update(repr(static).encode())
    for name in ("text_encoder", "text_encoder_2", "unet", "vae"):
        digest.update(_config_text(getattr(programs.modules, name)).encode())
    digest.update(repr(programs.modules.vae_scale_factor).encode())
    if key.kind == "merge":  # its arguments are the LoRAs' kernels and slots, not a component's weights
        digest.update(repr((programs.lora_layout, jax.tree_util.tree_map(
            lambda x: (x.shape, str(x.dtype)), programs.abstract_args(key)))).encode())  # fmt: skip
    leaves = jax.tree_util.tree_flatten_with_path(programs.weights(key, programs._params))[0]
    digest.update(repr([(jax.tree_util.keystr(path), leaf.shape, str(leaf.dtype)) for path, leaf in leaves]).encode())
    here = Path(__file__).resolve().parent.parent  # pipeline/
    for name in PROGRAM_SOURCES:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:20]


def _config_text(module) -> str:
    """A module's config as sorted text, without bookkeeping fields (paths, library versions)."""
    config = getattr(module, "config", None)
    if config is None:
        return "none"
    items = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    skip = ("_name_or_path", "transformers_version", "_diffusers_version", "_commit_hash")
    return json.dumps({k: v for k, v in items.items() if k not in skip and not k.startswith("_")}, sort_keys=True,
                      default=repr)  # fmt: skip


def _file_name(key: ProgramKey) -> str:
    return key.label.replace(" ", "_") + ".jaxexe"


def save_precompiled(
    programs: ServedPrograms, keys: list[ProgramKey], directory: str | Path, *, topology: str, settings: dict,
    progress=logger.info,
) -> dict:  # fmt: skip
    """Compile `keys` for `programs`' mesh and write each serialized executable plus `manifest.json`; the manifest.

    Compiled here and now, never taken from JAX's persistent cache: an XLA:CPU executable the cache loaded serializes
    without its kernels ("Function ... not found" when the copy runs), and a TPU topology's compile-only client
    cannot read the cache at all. Call it with the cache off (`precompile` turns it off).
    """
    from jax.experimental.serialize_executable import serialize

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    devices = programs.mesh.devices.flat
    first = next(iter(programs.mesh.devices.flat))
    entries = []
    for key in keys:
        started = time.perf_counter()
        compiled = programs.lower(key).compile()
        blob = pickle.dumps(serialize(compiled))  # (executable bytes, argument tree, result tree)
        (directory / _file_name(key)).write_bytes(blob)
        seconds = time.perf_counter() - started
        entries.append({**_key_fields(key), "label": key.label, "file": _file_name(key), "bytes": len(blob),
                        "fingerprint": fingerprint(programs, key), "compile_s": round(seconds, 2)})  # fmt: skip
        progress(f"precompiled {key.label} in {seconds:.1f} s ({len(blob) / 2**20:.1f} MiB)")
    manifest = {
        "format": FORMAT,
        "topology": topology,
        "platform": first.platform,
        "device_kind": first.device_kind,
        "device_count": len(list(devices)),
        "versions": versions(),
        "attention": programs.attention,
        "settings": settings,  # what the server was asked for (informational)
        "programs": entries,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _key_fields(key: ProgramKey) -> dict:
    return {"kind": key.kind, "height": key.height, "width": key.width, "cfg": key.cfg}


@dataclass
class LoadReport:
    """What `load_precompiled` did: labels loaded, and labels left to compile with the reason."""

    loaded: list[str] = field(default_factory=list)
    compile: dict[str, str] = field(default_factory=dict)  # label -> why it is compiled here
    seconds: float = 0.0

    def summary(self, directory) -> str:
        """One line: which programs were loaded and which are compiled, and why."""
        total = len(self.loaded) + len(self.compile)
        line = f"precompiled {directory}: loaded {len(self.loaded)} of {total} programs in {self.seconds:.1f} s"
        if self.compile:
            reasons: dict[str, list[str]] = {}
            for label, why in self.compile.items():
                reasons.setdefault(why, []).append(label)
            line += "; compiling " + "; ".join(f"{', '.join(labels)} ({why})" for why, labels in reasons.items())
        return line


def load_precompiled(programs: ServedPrograms, keys: list[ProgramKey], directory: str | Path) -> LoadReport:
    """Install the executables in `directory` that match `programs` (devices, versions, program text) for `keys`.

    Nothing raises for a mismatch: such programs are left for the usual compilation, and the report says why.
    """
    from jax.experimental.serialize_executable import deserialize_and_load

    started = time.perf_counter()
    directory = Path(directory)
    report = LoadReport()
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        report.compile = {key.label: f"no readable {MANIFEST}: {type(exc).__name__}" for key in keys}
        return _logged(report, directory, started)
    first = next(iter(programs.mesh.devices.flat))
    here = {"format": FORMAT, "device_kind": first.device_kind, "device_count": int(programs.mesh.devices.size),
            "versions": versions()}  # fmt: skip
    for name, value in here.items():
        if manifest.get(name) != value:
            why = f"built for {name} {manifest.get(name)}, this server has {value}"
            report.compile = {key.label: why for key in keys}
            return _logged(report, directory, started)
    entries = {entry["label"]: entry for entry in manifest.get("programs", [])}
    for key in keys:
        entry = entries.get(key.label)
        if entry is None:
            report.compile[key.label] = "not in the manifest"
            continue
        if fingerprint(programs, key) != entry["fingerprint"]:
            report.compile[key.label] = "program differs (model, settings or code changed)"
            continue
        try:
            blob, in_tree, out_tree = pickle.loads((directory / entry["file"]).read_bytes())
            compiled = deserialize_and_load(blob, in_tree, out_tree, execution_devices=list(programs.mesh.devices.flat))
        except Exception as exc:  # a truncated file, a runtime that refuses it: compile instead
            report.compile[key.label] = f"could not load: {type(exc).__name__}: {str(exc)[:80]}"
            continue
        programs.install(key, compiled)
        report.loaded.append(key.label)
    return _logged(report, directory, started)


def _logged(report: LoadReport, directory, started: float) -> LoadReport:
    report.seconds = time.perf_counter() - started
    logger.info("%s", report.summary(directory))
    return report
