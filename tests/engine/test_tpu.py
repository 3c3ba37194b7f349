"""TPU without a TPU: the served programs compiled by the real TPU compiler (libtpu, topology v5e:2x2) on this CPU
host, so a change that breaks TPU lowering, the splash (Mosaic) kernel or HBM fit fails here; and the precompiled
start-up as a CPU round trip (executables written by `python -m pipeline precompile --topology cpu`, a server that
starts with zero compilations and makes the same pixels).

What is compiled for TPU is kept small: the step program with `xla` at 64x64 (CFG), the step with a ControlNet with
`splash` at 192x160 (no CFG: the tiny UNet's first attention level then has 120 tokens, which splash pads to 128 and
masks, so the Mosaic kernel with segment ids is in the program; at 64x64 every shape falls back to xla), encode and
decode once.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FIXTURES, REPO, TEST_SIZE, TEST_STEPS, generate
from reference import reference_attention

TOPOLOGY = "v5e:2x2"
#: The IP-Adapter fixture (scripts/make_ip_adapter_fixtures.py, for tiny-pt's UNet: the tiny checkpoint's architecture).
IP_ADAPTER = FIXTURES / "ip-adapter" / "ip-adapter_tiny.safetensors"
IP_PICTURE = FIXTURES / "ip-adapter-image-a.png"
#: (height, width) where the tiny UNet's first attention level has 10 x 12 = 120 tokens: splash, padded to 128.
SPLASH_SIZE = (160, 192)


def _libtpu() -> bool:
    from bench.tpu.cost import libtpu_available

    return libtpu_available()


needs_libtpu = pytest.mark.skipif(
    not _libtpu(), reason='libtpu is not installed (pip install "jax[tpu]==0.10.2", in requirements-dev.txt)'
)


@pytest.fixture(scope="module")
def tpu_programs():
    """The tiny checkpoint's served programs on v5e:2x2's 4 chips (abstract bf16 weights), one per core, built as the
    generator builds them (`pipeline.generator.build_programs`, through the bench's `served_programs`)."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # another process (a bench) may hold libtpu
    from bench.tpu.programs import served_programs
    from pipeline.device.sharding import data_mesh
    from pipeline.host.compiling.aot import topology_devices
    from pipeline.host.compiling.compile_cache import configure_compilation_cache

    devices = topology_devices(TOPOLOGY)
    assert len(devices) == 4 and devices[0].device_kind == "TPU v5 lite"
    mesh = data_mesh(devices)
    cached = jax.config.jax_enable_compilation_cache
    configure_compilation_cache(False)  # a topology's compile-only client cannot read JAX's persistent cache
    yield {core: served_programs("tiny", "bfloat16", mesh, core) for core in ("xla", "splash")}
    configure_compilation_cache(cached)


#: The plain step with `xla` (64x64, CFG, the served three windows): compiled for v5e once, read by two tests.
XLA_STEP = ("step", TEST_SIZE, TEST_SIZE, True)


@pytest.fixture(scope="module")
def xla_step_row(tpu_programs):
    """`compile_one`'s row of the plain `xla` step on v5e:2x2 (about 8 s of TPU compile): the served programs' test
    checks it, the cross-attention cache's test compares its own step against it."""
    from bench.tpu.programs import compile_one
    from pipeline.host.compiling.programs import ProgramKey

    return compile_one(tpu_programs["xla"], ProgramKey(*XLA_STEP), "xla", TOPOLOGY, progress=lambda _: None)


@needs_libtpu
def test_served_programs_compile_for_tpu_v5e(tpu_programs, xla_step_row):
    from bench.tpu.programs import compile_one
    from pipeline.host.compiling.programs import ProgramKey

    rows = [xla_step_row]
    for core, key in (
        # The UNet's step with a ControlNet, splash: the plain splash step is this program less the ControlNet
        # (test_splash_kernel_is_in_the_tpu_program lowers that one), so one TPU compile covers both.
        ("splash", ProgramKey("step_control", *SPLASH_SIZE, False, None, (0,))),
        (None, ProgramKey("encode", cfg=True)),
        (None, ProgramKey("decode", TEST_SIZE, TEST_SIZE)),
    ):
        programs = tpu_programs[core or "xla"]
        rows.append(compile_one(programs, key, core, TOPOLOGY, progress=lambda _: None))
    for row in rows:
        assert row["fits"], f"{row['program']} needs {row['hbm_total_bytes']} bytes of HBM per chip"
        assert row["flops"] > 0 and row["bytes_accessed"] > 0 and row["roofline_s"] > 0, row
        assert row["hbm_bytes"]["arguments"] > 0 and row["hbm_bytes"]["code"] > 0, row
    control = rows[1]
    # The 120-token self-attention runs in the kernel, the UNet's and the ControlNet's blocks' alike; the 30-token
    # level falls back (the cross-attention over the prompt's 77-token windows is XLA's masked core whatever the
    # kind: device/attention.context_lengths).
    assert control["kind"] == "step_control" and control["fallbacks"]
    assert not any("q (1, 120, 4, 16), k (1, 120" in line for line in control["fallbacks"])
    assert any("q (1, 30, 4, 16), k (1, 30" in line for line in control["fallbacks"]), control["fallbacks"]


@needs_libtpu
def test_lora_merge_program_compiles_for_tpu_v5e():
    """`python -m bench tpu --kinds merge`'s program on the tiny checkpoint: the kohya-style layout (UNet transformer
    and both text encoders' attention and MLP kernels), compiled for v5e:2x2 with abstract weights (~15 s)."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from bench.tpu.programs import compile_one, layout_fields, lora_budget, merge_layout, served_programs
    from pipeline.device.sharding import data_mesh
    from pipeline.host.compiling.aot import topology_devices
    from pipeline.host.compiling.compile_cache import configure_compilation_cache
    from pipeline.host.compiling.programs import ProgramKey

    layout = merge_layout("tiny", "bfloat16", rank=8)
    components = {leaf[0] for leaf in layout.leaves}
    assert components == {"unet", "text_encoder", "text_encoder_2"}, components
    assert all("attentions_" in "/".join(leaf) for leaf in layout.leaves if leaf[0] == "unet")
    cached = jax.config.jax_enable_compilation_cache
    configure_compilation_cache(False)
    try:
        programs = served_programs("tiny", "bfloat16", data_mesh(topology_devices(TOPOLOGY)), "xla", layout=layout)
        row = compile_one(programs, ProgramKey("merge"), None, TOPOLOGY, progress=lambda _: None)
    finally:
        configure_compilation_cache(cached)
    row.update(layout_fields(layout, "bfloat16"))
    assert row["fits"] and row["flops"] > 0 and row["hbm_bytes"]["arguments"] >= 2 * row["lora_kernel_bytes"], row
    step = {**row, "program": "step 1024x1024 cfg", "kind": "step", "attention": "xla"}  # a stand-in step row
    (budget,) = lora_budget([row, step], TOPOLOGY)
    assert budget["step_upper_bytes"] == 2 * row["hbm_total_bytes"] and budget["step_upper_fits"]


@needs_libtpu
def test_splash_kernel_is_in_the_tpu_program(tpu_programs):
    from pipeline.host.compiling.programs import ProgramKey

    text = tpu_programs["splash"].lower(ProgramKey("step", *SPLASH_SIZE, False)).as_text()
    assert "tpu_custom_call" in text  # the Mosaic kernel, not an xla fallback


@pytest.mark.parametrize("length", [120, 248])
def test_splash_pads_lengths_off_128_exactly(length):
    """SDXL's 1344x768 has 4032- and 1008-token self-attention: splash pads to 128 and masks the padding off."""
    import jax.numpy as jnp

    from pipeline.device import attention

    rng = np.random.default_rng(length)
    q, k, v = (jnp.asarray(rng.standard_normal((1, length, 2, 64)), jnp.float32) for _ in range(3))
    assert attention.splash_supported(q.shape, k.shape) and attention.splash_length(length) % 128 == 0
    out = attention.splash_attention(q, k, v, 0.125, interpret=True, block=128)
    exact = reference_attention(q, k, v, 0.125)
    assert np.abs(np.asarray(out, np.float64) - exact).max() <= 1e-5
    assert not attention.splash_supported((1, 30, 2, 64), (1, 30, 2, 64))  # 30 -> 128 would pad too much


def test_precompiled_round_trip_starts_without_compiling(engine, tiny_dir, tmp_path):
    """`precompile --topology cpu` (in a subprocess, like a build step) with `--images-per-device 2
    --merge-requests --ip-adapter`: N's programs (with the image prompt's program and its step twin) and, in their
    own folder, the one-image calls' text-to-image programs. A merging server started with the directory loads every
    program and compiles nothing, a lone request (a call of one image per device) gets the one-image engine's pixels
    bit for bit, and a request with an image prompt compiles nothing either. A manifest from other versions is
    refused as a whole. One prompt window, no previews, no speed levers: the subprocess compiles every program past
    the cache, so only the ones a plain short prompt runs (with the levers: 20 programs, 8 of them UNet steps, three
    times the compile; a lone request's pixels are the same either way). (One round trip covers the plain and the
    merging start: a second precompile cost a minute.)"""
    from pipeline.cluster.join_options import ClusterOptions
    from pipeline.config import EngineConfig
    from pipeline.generator import Generator
    from pipeline.host.compiling.aot import MANIFEST, call_size_directory, load_precompiled
    from pipeline.startup import start

    out = tmp_path / "precompiled"
    command = [
        sys.executable,
        "-m",
        "pipeline",
        "precompile",
        "--topology",
        "cpu",
        "--model",
        str(tiny_dir),
        "--height",
        str(TEST_SIZE),
        "--width",
        str(TEST_SIZE),
        "--dtype",
        "float32",
        "--prompt-windows",
        "1",
        "--no-previews",
        "--no-speed-levers",
        "--images-per-device",
        "2",
        "--merge-requests",
        "--ip-adapter",
        str(IP_ADAPTER),
        "--out",
        str(out),
    ]
    done = subprocess.run(command, cwd=REPO, env=os.environ, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    config = EngineConfig(
        model=str(tiny_dir),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=TEST_STEPS,
        dtype="float32",
        compilation_cache=False,
        prompt_windows=1,
        previews=False,
        speed_levers=False,
        per_device_batch=2,
        merge_requests=True,
        ip_adapters=(str(IP_ADAPTER),),
    )
    started = start(config, ClusterOptions(), precompiled=str(out))
    generator = started.engine
    small = json.loads((call_size_directory(out, 1) / MANIFEST).read_text())
    assert small["images_per_device"] == 1 and json.loads((out / MANIFEST).read_text())["images_per_device"] == 2
    assert {entry["label"] for entry in small["programs"]} == {key.label for key in generator.merged_program_keys()}
    assert started.precompiled.compile == {} and generator.compile_count == 0
    mine = generate(generator, "a lighthouse at dusk", seed=11)
    assert generator.recent_runs[-1]["images_per_device"] == 1
    theirs = generate(engine, "a lighthouse at dusk", seed=11)
    for a, b in zip(mine.images, theirs.images, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["device_count"] == engine.device_count and manifest["versions"]["jax"]
    assert {p["label"] for p in manifest["programs"]} == {key.label for key in generator.program_keys()}
    assert any(key.kind == "image_prompt" for key in generator.program_keys())
    prompted = generate(
        generator,
        "a lighthouse at dusk",
        seed=11,
        ip_images=[{"adapter": "ip-adapter_tiny", "image": IP_PICTURE.read_bytes()}],
    )
    assert generator.compile_count == 0 and len(prompted.images) == generator.num_images

    # A manifest from other versions is refused as a whole, with the reason, and nothing is installed.
    manifest["versions"]["jaxlib"] = "0.0.1"
    (out / MANIFEST).write_text(json.dumps(manifest))
    other = Generator.from_pretrained(
        str(tiny_dir),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=TEST_STEPS,
        dtype="float32",
        compilation_cache=False,
        prompt_windows=1,
        previews=False,
        speed_levers=False,
        per_device_batch=2,
    )
    report = load_precompiled(other.programs, other.program_keys(), out)
    assert not report.loaded and all("jaxlib" in why for why in report.compile.values())
    keys = other.program_keys()
    assert f"loaded 0 of {len(keys)}" in report.summary(out) and not any(map(other.programs.is_compiled, keys))


@needs_libtpu
def test_int8_step_compiles_for_tpu_v5e_with_int8_weights():
    """`--quantize int8`'s whole-UNet step (tiny checkpoint, 64x64, CFG) compiled for v5e:2x2: the TPU program keeps
    int8 operands (s8) and its weight arguments are well under the bf16 step's (int8 kernels + per-channel scales)."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from bench.tpu.cost import compiled_cost
    from bench.tpu.programs import served_programs
    from pipeline.device.sharding import data_mesh
    from pipeline.host.compiling.aot import topology_devices
    from pipeline.host.compiling.compile_cache import configure_compilation_cache
    from pipeline.host.compiling.programs import ProgramKey

    mesh = data_mesh(topology_devices(TOPOLOGY))
    key = ProgramKey("step_full", TEST_SIZE, TEST_SIZE, True)

    def weight_bytes(programs):
        leaves = jax.tree_util.tree_leaves(programs.abstract_args(key)[0])
        return sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)

    cached = jax.config.jax_enable_compilation_cache
    configure_compilation_cache(False)
    try:
        int8 = served_programs("tiny", "bfloat16", mesh, "xla", quantize="int8")
        compiled = int8.lower(key).compile()
    finally:
        configure_compilation_cache(cached)
    cost = compiled_cost(compiled)
    assert cost.flops > 0 and cost.hbm_total > 0
    assert "s8[" in compiled.as_text()
    assert weight_bytes(int8) < 0.6 * weight_bytes(served_programs("tiny", "bfloat16", mesh, "xla"))


@needs_libtpu
def test_cross_attention_cache_programs_compile_for_tpu_v5e(xla_step_row):
    """`--cross-attention-cache` on v5e:2x2 (tiny checkpoint, 64x64, CFG, three windows): the table's program and the
    step that reads it compile, and that step does fewer FLOPs than the one projecting the text
    itself (`xla_step_row`, the served programs' test's; SDXL's figures: bench/HISTORY.md). With `xla`: the table
    replaces the cross-attention's projections, which no kernel choice touches (cross-attention is XLA's core
    whatever the kind), and splash's Mosaic compile, half this test's time at 192x160, is checked by
    test_served_programs_compile_for_tpu_v5e."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from bench.tpu.cost import compiled_cost
    from bench.tpu.programs import served_programs
    from pipeline.device.sharding import data_mesh
    from pipeline.host.compiling.aot import topology_devices
    from pipeline.host.compiling.compile_cache import configure_compilation_cache
    from pipeline.host.compiling.programs import ProgramKey

    mesh = data_mesh(topology_devices(TOPOLOGY))
    step = ProgramKey(*XLA_STEP)
    cached = jax.config.jax_enable_compilation_cache
    configure_compilation_cache(False)
    try:
        table = served_programs("tiny", "bfloat16", mesh, "xla", cross_attention_cache=True)
        cost = compiled_cost(table.lower(step).compile())
        made = compiled_cost(table.lower(ProgramKey("cross_kv", cfg=True)).compile())
    finally:
        configure_compilation_cache(cached)
    assert len(table.abstract_args(step)[0]["cross_kv"]) == 17  # one (keys, values) pair per transformer layer
    assert made.flops > 0 and cost.flops < xla_step_row["flops"]
    # Bytes about even: in the rows' loop (device/step_block.py) the table is read at every row, the projecting
    # step's text products hoisted; one row a program, the table moved 1.1 % fewer, four 1.7 % more (2026-12-07).
    assert cost.bytes_accessed < 1.05 * xla_step_row["bytes_accessed"]


def test_bench_tpu_names_extras_regional_and_image_prompt_steps_and_keeps_them_out_of_the_requests():
    """`python -m bench tpu --kinds step_pag,step_freeu,step_regions2`: the whole-UNet step with PAG / FreeU
    (ProgramKey.extras, as a server with --pag / --freeu-programs compiles it) or blending 2 / 4 regional parts (a P
    window text, as --region-parts compiles it), selected by `--only` apart from the plain step, left out of the
    default kinds; a row with `extras` or `regions` never stands in for the plain step in the predicted requests.
    `--ip-adapter plain|plus --kinds image_prompt,step_image`: the image prompt's program and the step reading 4 or
    16 image tokens, refused without the adapter; its rows stay out of the predictions too."""
    from bench.tpu.programs import DEFAULT_KINDS, jobs, parse_args, predictions
    from pipeline.host.compiling.programs import ProgramKey

    args = parse_args(["--kinds", "step,step_pag,step_freeu", "--cfg", "on", "--attention", "splash"])
    keys = [key for key, _ in jobs(args, [(1024, 1024)])]
    assert keys == [ProgramKey("step", 1024, 1024, True, 3, extras=extras) for extras in ((), ("freeu",), ("pag",))]
    assert keys[2].label == "step 1024x1024 cfg 3 windows pag"
    only = parse_args(
        ["--kinds", "step,step_pag", "--cfg", "on", "--attention", "splash", "--only", "step 1024x1024 cfg pag"]
    )
    assert [key for key, _ in jobs(only, [(1024, 1024)])] == [keys[2]]
    assert "step_pag" not in DEFAULT_KINDS and "step" in DEFAULT_KINDS
    regional = parse_args(["--kinds", "step_regions2,step_regions4", "--cfg", "on", "--attention", "splash"])
    assert [key for key, _ in jobs(regional, [(1024, 1024)])] == [
        ProgramKey("step", 1024, 1024, True, parts, parts=parts) for parts in (2, 4)
    ]
    assert "step_regions2" not in DEFAULT_KINDS and "step_regions4" not in DEFAULT_KINDS
    for adapter, tokens in (("plain", 4), ("plus", 16)):
        prompted = parse_args(["--kinds", "image_prompt,step_image", "--ip-adapter", adapter, "--cfg", "on"])
        assert [key for key, _ in jobs(prompted, [(1024, 1024)])] == [
            ProgramKey("step", 1024, 1024, True, 3, image_tokens=tokens),
            ProgramKey("step", 1024, 1024, True, 3, image_tokens=tokens),  # xla, splash
            ProgramKey("image_prompt"),
        ]
    with pytest.raises(SystemExit):
        parse_args(["--kinds", "step_image"])  # no --ip-adapter: argparse's one line, exit 2
    assert "image_prompt" not in DEFAULT_KINDS and "step_image" not in DEFAULT_KINDS
    from bench.tpu.programs import sdxl_controlnet

    assert type(sdxl_controlnet("bfloat16", "union")).__name__ == "SDXLControlNetUnion"  # --controlnet union
    assert type(sdxl_controlnet("bfloat16")).__name__ == "SDXLControlNet"

    def row(kind, roofline, **more):
        common = {"topology": TOPOLOGY, "size": "1024x1024", "attention": "splash", "quantize": "none", "cfg": None}
        return {**common, "kind": kind, "roofline_s": roofline, "prompt_windows": 3, "images": 4, "chips": 4, **more}

    rows = [row("encode", 0.001, cfg=True, size=None), row("start", 0.001), row("decode", 0.001)]
    rows += [row("step", 0.1, cfg=True), row("step", 0.2, cfg=True, extras=["pag"])]
    rows += [row("step", 0.3, cfg=True, regions=2, prompt_windows=2), row("step", 0.4, cfg=True, image_tokens=4)]
    rows += [row("step_control", 0.5, cfg=True, controlnet="union")]  # never the canny ControlNet request's step
    (exact,) = [p for p in predictions(rows, TOPOLOGY) if p["request"] == "SDXL base, 25 steps, CFG (exact)"]
    assert exact["predicted_s"] == pytest.approx(0.003 + 25 * 0.1)


def test_bench_tpus_abstract_adapters_have_sdxls_shapes():
    """bench/tpu/image_prompt.py's abstract IP-Adapters at SDXL's shapes, as h94's files load: ViT-H (1280 wide, 32
    layers) with the Resampler's 16 tokens traced here (ViT-bigG's 48 layers cost twice as long to trace: its
    figures, 1664 wide with the plain projection's 4 tokens, are checked as data); one to_k_ip / to_v_ip pair per
    attn2 of SDXL's UNet (70), each as wide as that layer's to_k, in the weights' dtype."""
    from bench.accelerator.flops import sdxl_networks
    from bench.tpu.image_prompt import SHAPES, abstract_tables

    unet = sdxl_networks(jnp.bfloat16)["unet"]
    unet_params = jax.eval_shape(unet.init_weights, jax.random.PRNGKey(0))
    bigg, plain = SHAPES["plain"]
    assert (bigg["hidden_size"], bigg["num_hidden_layers"], plain["tokens"]) == (1664, 48, 4)
    tables = abstract_tables("plus", unet_params, unet.config, "bfloat16")
    (adapter,) = tables.adapters
    config = adapter.encoder.module.config
    assert (config.hidden_size, config.num_hidden_layers, adapter.projection.tokens) == (1280, 32, 16)
    layers = adapter.params["layers"]
    assert len(layers) == 70 and tables.slots == 1
    dtypes = {leaf.dtype.name for leaf in jax.tree_util.tree_leaves(tables.with_weights({})["ip_adapters"])}
    assert dtypes == {"bfloat16"}
    mid = unet_params["mid_block"]["attentions_0"]["transformer_blocks_0"]["attn2"]["to_k"]["kernel"]
    assert layers["mid_block/attentions_0/transformer_blocks_0/attn2"]["to_k_ip"].shape == mid.shape == (2048, 1280)
