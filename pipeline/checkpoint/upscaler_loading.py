"""ESRGAN-family upscaler files (RRDBNet `.safetensors` or `.pth`) -> `nets/rrdbnet.RRDBNet` and its parameters.

No torch. A `.pth` is torch's zip format: `<name>/data.pkl` (the pickled state dict) beside `<name>/data/<key>`
(each storage's raw bytes). Unpickling runs whatever callables the pickle names, so it is read with an Unpickler
whose `find_class` hands out only what a state dict of tensors needs (OrderedDict, torch's tensor and parameter
rebuilders, replaced here by NumPy ones, and the storage classes as dtype markers) and refuses any other name in one
sentence: a file that would run code is never run. torch's legacy (pre-1.6, non-zip) format is refused.

Two key layouts are read: basicsr's (Real-ESRGAN: `conv_first`, `body.N.rdb1.conv1`, `conv_body`, `conv_up1`,
`conv_up2`, `conv_hr`, `conv_last`, perhaps inside `params_ema`/`params`) and the original ESRGAN's nn.Sequential
indices (4x-UltraSharp and most community models: `model.0`, `model.1.sub.N.RDB1.conv1.0`, `model.1.sub.<nb>`, then
the upsample convs, `conv_hr` and `conv_last` at growing indices). RRDBs, features, growth, the input's
pixel-unshuffle and the upsamples are read from the shapes; every tensor must fill one parameter of that shape and
every parameter must be filled, else one sentence names what is wrong.
"""

from __future__ import annotations

import math
import pickle
import re
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict
from safetensors.numpy import load_file

from ..contract.errors import InvalidInput
from ..device.nets.rrdbnet import RRDBNet

#: The file kinds an upscaler may be.
SUFFIXES = (".safetensors", ".pth")
#: torch's storage classes (as pickled by torch.save) -> their NumPy dtype.
_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "DoubleStorage": np.float64,
    "BFloat16Storage": ml_dtypes.bfloat16,
}
_OLD_RRDB = re.compile(r"model\.1\.sub\.(\d+)\.RDB([123])\.conv([1-5])\.0\.(weight|bias)")
_OLD_TOP = re.compile(r"model\.(\d+)\.(weight|bias)")
_NEW_RRDB = re.compile(r"body\.(\d+)\.rdb([123])\.conv([1-5])\.(weight|bias)")


@dataclass(frozen=True)
class UpscalerWeights:
    """One loaded upscaler: the name requests give it (the file's stem), its module and float32 parameters."""

    name: str
    module: object  # device.nets.rrdbnet.RRDBNet
    params: dict  # nested NumPy float32 arrays, the module's tree

    @property
    def scale(self) -> float:
        return self.module.scale


class _Storage:
    """A storage class named in the pickle: only its dtype matters."""

    def __init__(self, name: str) -> None:
        self.dtype = np.dtype(_STORAGE_DTYPES[name])


def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    """torch._utils._rebuild_tensor_v2 in NumPy: the view of `storage` at `offset` with `size` and `stride`."""
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if len(size) != len(stride) or min(stride, default=0) < 0 or offset < 0:
        raise InvalidInput("it holds a tensor with a malformed shape.")
    if math.prod(size) and offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) >= storage.size:
        raise InvalidInput("it holds a tensor reaching past its storage.")
    strides = tuple(s * storage.itemsize for s in stride)
    return np.lib.stride_tricks.as_strided(storage[offset:], shape=size, strides=strides).copy()


def _rebuild_parameter(data, requires_grad=False, hooks=None):
    return data


class _StateDictUnpickler(pickle.Unpickler):
    """Unpickles a state dict and nothing else: any global outside the allowed few is refused, never imported."""

    _ALLOWED = {
        ("collections", "OrderedDict"): OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    }

    def __init__(self, file, archive: zipfile.ZipFile, prefix: str, byteorder: str) -> None:
        super().__init__(file)
        self.archive, self.prefix, self.byteorder = archive, prefix, byteorder
        self.storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str):
        if (module, name) in self._ALLOWED:
            return self._ALLOWED[(module, name)]
        if module == "torch" and name in _STORAGE_DTYPES:
            return _Storage(name)  # a marker persistent_load reads; not callable
        raise InvalidInput(f"it names {module}.{name}, which a file of weights has no need of; it was not loaded.")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise InvalidInput("it refers to something other than a tensor storage.")
        _, storage_type, key, _location, numel = pid
        marker = storage_type
        if not isinstance(marker, _Storage):
            raise InvalidInput("it holds a storage of a type other than float32, float16, float64 or bfloat16.")
        if key not in self.storages:
            try:
                raw = self.archive.read(f"{self.prefix}/data/{key}")
            except KeyError:
                raise InvalidInput(f"its storage {key} is missing (a truncated file?).") from None
            dtype = marker.dtype.newbyteorder("<" if self.byteorder == "little" else ">")
            if len(raw) < int(numel) * dtype.itemsize:
                raise InvalidInput(f"its storage {key} is shorter than it says (a truncated file?).")
            self.storages[key] = np.frombuffer(raw, dtype, count=int(numel)).astype(marker.dtype)
        return self.storages[key]


def read_pth(path: Path) -> dict:
    """The object a torch zip `.pth` holds, its tensors as NumPy arrays; InvalidInput for anything unsafe."""
    if not zipfile.is_zipfile(path):
        raise InvalidInput(
            "it is in torch's legacy (pre-1.6) format, which cannot be read safely without torch; "
            "re-save it with torch.save or convert it to .safetensors."
        )
    with zipfile.ZipFile(path) as archive:
        pickles = [name for name in archive.namelist() if name.endswith("/data.pkl") and name.count("/") == 1]
        if len(pickles) != 1:
            raise InvalidInput("it is a zip file but not one torch.save wrote (no single <name>/data.pkl).")
        prefix = pickles[0].split("/")[0]
        byteorder = "little"
        if f"{prefix}/byteorder" in archive.namelist():
            byteorder = archive.read(f"{prefix}/byteorder").decode("ascii", "replace").strip()
        with archive.open(pickles[0]) as file:
            try:
                return _StateDictUnpickler(file, archive, prefix, byteorder).load()
            except InvalidInput:
                raise
            except Exception as error:  # a damaged pickle: one sentence, not its traceback
                raise InvalidInput(f"its pickled state dict cannot be read ({type(error).__name__}).") from None


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """{name: array} from a `.safetensors` or `.pth` upscaler file, unwrapped from `params_ema`/`params`."""
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except Exception as error:
            raise InvalidInput(f"it is not a readable .safetensors file ({type(error).__name__}).") from None
    state = read_pth(path)
    for wrapper in ("params_ema", "params", "state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
            break
    if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
        raise InvalidInput("it holds no state dict of tensors.")
    return dict(state)


def new_layout(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """basicsr's names for either layout's tensors (a leading `module.` dropped); InvalidInput if neither."""
    tensors = {key.removeprefix("module."): value for key, value in tensors.items()}
    if "conv_first.weight" in tensors:
        return tensors
    if "model.0.weight" not in tensors:
        raise InvalidInput("it is not an RRDBNet (ESRGAN) model: it has neither conv_first nor model.0 weights.")
    blocks = {int(m[1]) for key in tensors if (m := _OLD_RRDB.fullmatch(key))}
    top = sorted({int(m[1]) for key in tensors if (m := _OLD_TOP.fullmatch(key))} - {0})
    if len(top) < 3:
        raise InvalidInput("it is not an RRDBNet (ESRGAN) model: too few convolutions after its RRDB blocks.")
    names = {0: "conv_first", top[-1]: "conv_last", top[-2]: "conv_hr"}
    names.update({index: f"conv_up{i + 1}" for i, index in enumerate(top[:-2])})
    renamed = {}
    for key, value in tensors.items():
        if m := _OLD_RRDB.fullmatch(key):
            renamed[f"body.{m[1]}.rdb{m[2]}.conv{m[3]}.{m[4]}"] = value
        elif m := _OLD_TOP.fullmatch(key):
            renamed[f"{names[int(m[1])]}.{m[2]}"] = value
        elif (m := re.fullmatch(r"model\.1\.sub\.(\d+)\.(weight|bias)", key)) and int(m[1]) == len(blocks):
            renamed[f"conv_body.{m[2]}"] = value
        else:
            raise InvalidInput(f"it is not an RRDBNet (ESRGAN) model this engine knows: unexpected tensor {key}.")
    return renamed


def rrdbnet_for(tensors: dict[str, np.ndarray]):
    """The RRDBNet whose shapes basicsr-named `tensors` have."""
    first, last = tensors["conv_first.weight"], tensors.get("conv_last.weight")
    unshuffle = math.isqrt(first.shape[1] // 3) if first.ndim == 4 and first.shape[1] % 3 == 0 else 0
    if unshuffle not in (1, 2, 4) or 3 * unshuffle**2 != first.shape[1]:
        raise InvalidInput(f"its first convolution takes {first.shape[1:2]} channels; RGB RRDBNets take 3, 12 or 48.")
    if last is None or last.ndim != 4 or last.shape[0] != 3:
        raise InvalidInput("its last convolution does not make an RGB image.")
    blocks = len({m[1] for key in tensors if (m := _NEW_RRDB.fullmatch(key))})
    upsamples = len({key for key in tensors if re.fullmatch(r"conv_up\d+\.weight", key)})
    if not blocks or not upsamples or "body.0.rdb1.conv1.weight" not in tensors:
        raise InvalidInput("it is not an RRDBNet (ESRGAN) model: it has no RRDB blocks or no upsampling.")
    growth = tensors["body.0.rdb1.conv1.weight"].shape[0]
    return RRDBNet(blocks=blocks, features=first.shape[0], growth=growth, unshuffle=unshuffle, upsamples=upsamples)


def convert(tensors: dict[str, np.ndarray]) -> tuple[object, dict]:
    """(module, params): basicsr-named torch tensors as the module's Flax tree (kernels [kh, kw, in, out]),
    each checked against the module's shapes."""
    module = rrdbnet_for(tensors)
    size = 4 * module.unshuffle
    shapes = flatten_dict(jax.eval_shape(module.init, jax.random.PRNGKey(0), jnp.zeros((1, size, size, 3)))["params"])
    flat = {}
    for key, value in tensors.items():
        *path, kind = key.split(".")
        if path and path[0] == "body" and len(path) == 4:
            path = [f"body_{path[1]}", path[2], path[3]]
        leaf = (*path, "kernel" if kind == "weight" else "bias")
        array = np.asarray(value, np.float32)
        array = array.transpose(2, 3, 1, 0) if kind == "weight" and array.ndim == 4 else array
        if leaf not in shapes or shapes[leaf].shape != array.shape:
            raise InvalidInput(f"its tensor {key} {tuple(value.shape)} has no place in the RRDBNet its shapes imply.")
        flat[leaf] = array
    missing = sorted(".".join(leaf) for leaf in shapes if leaf not in flat)
    if missing:
        raise InvalidInput(f"it lacks {len(missing)} of the RRDBNet's weights (first: {missing[0]}).")
    return module, unflatten_dict(flat)


def load_upscaler(path: str | Path) -> UpscalerWeights:
    """The upscaler in `path`, named by its stem; InvalidInput (one sentence naming the file) if it cannot be."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise InvalidInput(f"Upscaler {path.name}: only .safetensors and .pth files are read.")
    try:
        module, params = convert(new_layout(read_tensors(path)))
    except InvalidInput as error:
        raise InvalidInput(f"Upscaler {path.name}: {error}") from None
    except OSError as error:
        raise InvalidInput(f"Upscaler {path.name} cannot be read ({error.strerror or type(error).__name__}).") from None
    return UpscalerWeights(name=path.stem, module=module, params=params)


def load_upscaler_dir(directory: str | Path, log) -> dict[str, UpscalerWeights]:
    """{name: weights} for each readable upscaler file in `directory`, sorted by name; a file that cannot be read
    is named by `log` (one line) and skipped."""
    found: dict[str, UpscalerWeights] = {}
    for path in sorted(Path(directory).iterdir()):
        if path.suffix not in SUFFIXES or not path.is_file():
            continue
        try:
            found.setdefault(path.stem, load_upscaler(path))
        except InvalidInput as error:
            log(f"{error} Skipped.")
    return found
