"""The project's own networks (pipeline/device/nets/) against diffusers' and transformers' Flax classes, through the
committed fixture tests/fixtures/networks-expected.npz + .json (scripts/make_network_fixtures.py; neither library's
Flax classes are imported here).

- Parameter trees (names and shapes) equal the old classes' for every case and for SDXL's full-size base, refiner
  and inpainting UNets, VAE, CLIP-L, CLIP-G and the ControlNet (`jax.eval_shape`: nothing allocated).
- float32 outputs equal the old classes' bit for bit: the tiny checkpoint's networks (base UNet, with ControlNet
  residuals, a refiner-shaped UNet, VAE encode and decode, both text encoders), the ControlNet's conditioning
  embedding, and full-width blocks (SDXL's 1280-wide transformer, a 640 -> 1280 resnet, the VAE's 512-wide middle,
  one CLIP-L and one CLIP-G layer) at a tiny spatial size.
- bfloat16 (module dtype and parameters, as the engine runs them): equal bit for bit too (see `BF16_TOLERANCE`).

Bit for bit on the tests' CPU platform (tests/conftest.py: 8 host devices), which the fixture script also uses, and on
the fixture's host's CPU: another CPU (its kernels, its vector widths) gives other last bits, and there the old classes
run again on this host, in the reference venv (`_old_classes_here`). XLA's CPU convolutions split their work by thread
pools the device count sizes, so the same program run with 1 device differs in the last bit for the tiny VAE decoder
(diffusers' class and this one alike, 1.2e-6 at most).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import FIXTURES, xla_flags
from tests.random_params import random_params, tree_shapes

MANIFEST = json.loads((FIXTURES / "networks-expected.json").read_text())
EXPECTED = np.load(FIXTURES / "networks-expected.npz")
#: The old classes' outputs computed on the hosts CI runs on, by host CPU (`_old_classes_here`).
HERE = FIXTURES / "networks-here"
#: bfloat16 against the old classes in bfloat16: the same operations in the same order, so the same bits (0).
BF16_TOLERANCE = 0.0


def _arrays(case: str, kind: str) -> dict[str, np.ndarray]:
    prefix = f"{case}/{kind}/"
    return {key[len(prefix) :]: EXPECTED[key] for key in EXPECTED.files if key.startswith(prefix)}


def _unet(config: dict, dtype):
    from pipeline.device.nets.unet import UNet2DConditionModel, UNetConfig

    return UNet2DConditionModel(UNetConfig.from_dict(config), dtype=dtype)


def _vae(config: dict, dtype):
    from pipeline.device.nets.vae import AutoencoderKL, VAEConfig

    return AutoencoderKL(VAEConfig.from_dict(config), dtype=dtype)


def _clip(config: dict, dtype, projection: bool):
    from pipeline.device.nets.clip import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    return cls(CLIPTextConfig.from_dict(config), dtype=dtype)


def _unet_call(module, params, x):
    residuals = sorted((k for k in x if k.startswith("residual_")), key=lambda k: int(k.split("_")[1]))
    out = module.apply(
        {"params": params},
        x["sample"],
        x["timesteps"],
        x["encoder_hidden_states"],
        added_cond_kwargs={"text_embeds": x["text_embeds"], "time_ids": x["time_ids"]},
        down_block_additional_residuals=tuple(x[k] for k in residuals) if residuals else None,
        mid_block_additional_residual=x.get("mid_residual"),
    )
    return {"sample": out.sample}


def _encode_call(module, params, x):
    posterior = module.apply({"params": params}, x["sample"], method=module.encode).latent_dist
    return {"mean": posterior.mean, "std": posterior.std}


def _decode_call(module, params, x):
    return {"sample": module.apply({"params": params}, x["latents"], method=module.decode).sample}


def _clip_call(module, params, x):
    out = module.apply({"params": params}, x["input_ids"])
    result = {"last_hidden_state": out.last_hidden_state}
    result.update({f"hidden_state_{i}": h for i, h in enumerate(out.hidden_states)})
    if out.text_embeds is not None:
        return {**result, "text_embeds": out.text_embeds}
    return {**result, "pooler_output": out.pooler_output}


def _block_call(*names):
    def call(module, params, x):
        return {"output": module.apply({"params": params}, *(x[n] for n in names))}

    return call


def _init_of(module, *example):
    return lambda key: module.init(key, *example)["params"]


def _cases() -> dict:
    """Per case: (module for a dtype, its init, apply(module, params, inputs) -> {name: array}), as the script's."""
    from pipeline.device.nets.clip import CLIPEncoderLayer, CLIPTextConfig
    from pipeline.device.nets.controlnet_embedding import ControlNetConditioningEmbedding
    from pipeline.device.nets.resnet import ResnetBlock2D
    from pipeline.device.nets.transformer import Transformer2DModel
    from pipeline.device.nets.vae_blocks import VAEMidBlock2D

    configs, f32 = MANIFEST["configs"], jnp.float32
    embedding = configs["controlnet_embedding"]

    def clip_layer(config):
        return lambda dtype: CLIPEncoderLayer(CLIPTextConfig.from_dict(config), dtype=dtype)

    def weights(module):
        return module.init_weights

    return {
        "unet": (lambda d: _unet(configs["unet"], d), weights, _unet_call),
        "unet_controlnet": (lambda d: _unet(configs["unet"], d), weights, _unet_call),
        "unet_refiner": (lambda d: _unet(configs["unet_refiner"], d), weights, _unet_call),
        "vae_encode": (lambda d: _vae(configs["vae"], d), weights, _encode_call),
        "vae_decode": (lambda d: _vae(configs["vae"], d), weights, _decode_call),
        "text_encoder": (lambda d: _clip(configs["text_encoder"], d, False), weights, _clip_call),
        "text_encoder_2": (lambda d: _clip(configs["text_encoder_2"], d, True), weights, _clip_call),
        "controlnet_embedding": (
            lambda d: ControlNetConditioningEmbedding(
                embedding["conditioning_embedding_channels"], tuple(embedding["block_out_channels"]), dtype=d
            ),
            lambda m: _init_of(m, jnp.zeros((1, 32, 32, 3), f32)),
            _block_call("conditioning"),
        ),
        "transformer_1280": (
            lambda d: Transformer2DModel(in_channels=1280, n_heads=20, d_head=64, depth=1, dtype=d),
            lambda m: _init_of(m, jnp.zeros((1, 4, 4, 1280), f32), jnp.zeros((1, 77, 2048), f32)),
            _block_call("hidden_states", "context"),
        ),
        "resnet_640_1280": (
            lambda d: ResnetBlock2D(640, 1280, dtype=d),
            lambda m: _init_of(m, jnp.zeros((1, 4, 4, 640), f32), jnp.zeros((1, 1280), f32)),
            _block_call("hidden_states", "temb"),
        ),
        "vae_mid_512": (
            lambda d: VAEMidBlock2D(512, resnet_groups=32, dtype=d),
            lambda m: _init_of(m, jnp.zeros((1, 4, 4, 512), f32)),
            _block_call("hidden_states"),
        ),
        "clip_l_layer": (
            clip_layer(configs["clip_l"]),
            lambda m: _init_of(m, jnp.zeros((1, 77, 768), f32)),
            _block_call("hidden_states"),
        ),
        "clip_g_layer": (
            clip_layer(configs["clip_g"]),
            lambda m: _init_of(m, jnp.zeros((1, 77, 1280), f32)),
            _block_call("hidden_states"),
        ),
    }


CASES = _cases()


def test_fixture_covers_every_case():
    assert set(MANIFEST["trees"]) == set(CASES)


def _shapes(init):
    return jax.eval_shape(init, jax.random.PRNGKey(0))


@pytest.mark.parametrize("case", sorted(CASES))
def test_tree_equals_the_old_classes(case):
    build, init, _ = CASES[case]
    assert tree_shapes(_shapes(init(build(jnp.float32)))) == MANIFEST["trees"][case]


FULL_SIZE = {
    "unet_base": lambda: _unet(MANIFEST["configs"]["sdxl_unet"], jnp.bfloat16).init_weights,
    "unet_refiner": lambda: _unet(MANIFEST["configs"]["sdxl_refiner_unet"], jnp.bfloat16).init_weights,
    "unet_inpainting": lambda: _unet(MANIFEST["configs"]["sdxl_inpaint_unet"], jnp.bfloat16).init_weights,
    "vae": lambda: _vae(MANIFEST["configs"]["sdxl_vae"], jnp.bfloat16).init_weights,
    "clip_l": lambda: _clip(MANIFEST["configs"]["clip_l"], jnp.bfloat16, False).init_weights,
    "clip_g": lambda: _clip(MANIFEST["configs"]["clip_g"], jnp.bfloat16, True).init_weights,
}


@pytest.mark.parametrize("name", sorted(FULL_SIZE))
def test_full_size_tree_equals_the_old_classes(name):
    """SDXL's own sizes (2.6 B parameters in all), traced only: the checkpoints' trees, leaf for leaf."""
    assert tree_shapes(_shapes(FULL_SIZE[name]())) == MANIFEST["full_size_trees"][name]


def test_controlnet_tree_is_unchanged():
    """The ControlNet at diffusers/controlnet-canny-sdxl-1.0's size keeps the tree its converter maps onto."""
    from pipeline.device.nets.controlnet import SDXLControlNet

    assert tree_shapes(_shapes(SDXLControlNet().init_weights)) == MANIFEST["full_size_trees"]["controlnet"]


def _run(case: str, dtype_name: str) -> dict[str, np.ndarray]:
    build, init, call = CASES[case]
    dtype = getattr(jnp, dtype_name)
    params = random_params(_shapes(init(build(jnp.float32))), MANIFEST["seed"])
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), params)
    inputs = {k: jnp.asarray(v, dtype) if v.dtype == np.float32 else v for k, v in _arrays(case, "input").items()}
    outputs = jax.jit(functools.partial(call, build(dtype)))(params, inputs)
    return {name: np.asarray(value.astype(jnp.float32)) for name, value in outputs.items()}


def _max_diff(got: dict, expected: dict) -> float:
    assert sorted(got) == sorted(expected)
    return max(float(np.max(np.abs(got[k] - expected[k]))) for k in expected)


#: Another XLA (the jax 0.11 line on Python >= 3.12) fuses and orders float sums its own way: there the outputs agree
#: to this fraction of each output's largest magnitude (measured on jax 0.11.2: UNet cases 1.6e-6 and 8.9e-5 absolute).
OTHER_XLA_TOLERANCE = 1e-4


@functools.cache
def _old_classes_here(dtype_name: str) -> dict[str, np.ndarray]:
    """The old classes' outputs in `dtype_name` computed on this host (scripts/make_network_fixtures.py --here, in the
    reference venv: diffusers 0.39 and transformers 4 with this jax). Asked for only where this host's bits differ from
    the committed fixture's: XLA:CPU's last bits depend on the CPU (an AMD EPYC with AVX-512 differs from the
    fixture's host in every case but one, under any `--xla_cpu_max_isa`; measured 2026-11-28). Read whole into memory,
    so the script's folder goes at once (it was left in TMPDIR).

    A host whose outputs are committed (`HERE`, written by the same command: `--here
    tests/fixtures/networks-here/host-<signature><flags>-float32.npz float32`, the signature of
    pipeline.host.compiling.compile_cache.host_cpu_signature, `<flags>` the `_compile_flags_tag`: the script runs with
    this process's XLA_FLAGS) reads them instead: the script took a minute and a half of a 2-core CI run."""
    import subprocess
    import tempfile

    from bench.reference_venv import reference_python
    from pipeline.host.compiling.compile_cache import host_cpu_signature
    from tests.conftest import REPO

    committed = HERE / f"host-{host_cpu_signature()}{_compile_flags_tag()}-{dtype_name}.npz"
    if committed.exists():
        with np.load(committed) as here:
            return dict(here)
    with tempfile.TemporaryDirectory(prefix="networks-here-") as folder:
        out = Path(folder) / f"{dtype_name}.npz"
        command = [str(reference_python()), "scripts/make_network_fixtures.py", "--here", str(out), dtype_name]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        with np.load(out) as here:
            return dict(here)


def _compile_flags_tag() -> str:
    """ "" under XLA's default compile flags, else "-" and a hash of those XLA_FLAGS set (the device count aside,
    conftest.xla_flags): the tests' own (conftest.TEST_COMPILE_FLAGS, LLVM's lighter optimisation) give other bits."""
    import hashlib

    flags = sorted(xla_flags().split())
    return "-" + hashlib.sha256(" ".join(flags).encode()).hexdigest()[:8] if flags else ""


def _here(case: str, dtype_name: str, expected: dict) -> dict[str, np.ndarray]:
    here = _old_classes_here(dtype_name)
    return {name: here[f"{case}/{dtype_name}/{name}"] for name in expected}


@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_bit_for_bit(case):
    """Bit for bit under the jax the fixture was written with (its json says which): with the committed outputs, or,
    on a host whose CPU gives other last bits, with the old classes run on this host; close under another jax."""
    got, expected = _run(case, "float32"), _arrays(case, "float32")
    assert sorted(got) == sorted(expected)
    same_xla = jax.__version__ == MANIFEST["versions"]["jax"]
    if same_xla and not all(np.array_equal(got[name], expected[name]) for name in expected):
        expected = _here(case, "float32", expected)
    for name in expected:
        scale = np.abs(expected[name]).max()
        assert np.isfinite(expected[name]).all() and scale > 0, name
        if same_xla:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{case}: {name}")
        else:
            np.testing.assert_allclose(
                got[name], expected[name], rtol=0, atol=OTHER_XLA_TOLERANCE * scale, err_msg=f"{case}: {name}"
            )


@pytest.mark.long  # bfloat16 is emulated on this CPU: minutes for the whole set; the float32 cases run the same code
@pytest.mark.parametrize("case", sorted(CASES))
def test_bfloat16_as_the_old_classes(case):
    """As the float32 test: the committed outputs, or where this host's CPU gives other bits, the old classes here."""
    got, expected = _run(case, "bfloat16"), _arrays(case, "bfloat16")
    if _max_diff(got, expected) > BF16_TOLERANCE and jax.__version__ == MANIFEST["versions"]["jax"]:
        expected = _here(case, "bfloat16", expected)
    assert _max_diff(got, expected) <= BF16_TOLERANCE, case
