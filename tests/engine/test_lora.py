"""LoRA (issue 27) through the request edge and the real engine: A1111's tags and the `loras` field, each refusal in
one sentence, and the engine's images with the PyTorch fixtures' LoRAs within 1 level of diffusers'
(`load_lora_weights` + `set_adapters`, tests/fixtures/lora-expected.*), the merged kernels changed by what PEFT's
`get_delta_weight` says, weights restored bit for bit, and no compile after start-up.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

import jax
import numpy as np
import pytest
from conftest import FIXTURES, LORA_NAMES, LORA_REFUSED

from pipeline.checkpoint.lora import lora_targets
from pipeline.config import EngineConfig
from pipeline.contract.errors import InvalidInput
from pipeline.contract.request import MAX_LORAS, Request, RequestRules, parse_request
from pipeline.device.lora import get_leaves

MANIFEST = json.loads((FIXTURES / "lora-expected.json").read_text())
ARRAYS = np.load(FIXTURES / "lora-expected.npz")
CASES = {case["name"]: case for case in MANIFEST["cases"]}
RULES = RequestRules(sizes=((64, 64),), loras=LORA_NAMES)
OFFERED = ", ".join(LORA_NAMES)


def refusal(**fields) -> str:
    """The one sentence parse_request refuses `fields` with."""
    with pytest.raises(InvalidInput) as error:
        parse_request(**{"prompt": "a cabin", "rules": RULES, **fields})
    message = str(error.value)
    sentence_ends = re.findall(r"[.!?](?:\s|$)", message.replace("e.g. ", ""))
    assert "\n" not in message and message.endswith(".") and len(sentence_ends) == 1, message
    return message


# ---- the request edge -----------------------------------------------------------------------------------------------


def test_tags_give_weights_and_leave_the_prompt_the_encoders_read():
    """<lora:NAME>, <lora:NAME:W>, <lora:NAME:TE:UNET> (te=/unet= allowed), names in any case: the encoders read the
    prompt without tags; the images' parameters keep them as written."""
    request = parse_request(
        "a cabin <lora:KOHYA_SGM:0.8> in snow <LORA:peft:te=0.5:unet=1.2>, <lora:locon>", rules=RULES
    )
    assert request.loras == (("kohya_sgm", 0.8, 0.8), ("peft", 0.5, 1.2), ("locon", 1.0, 1.0))
    assert request.styled_prompt == "a cabin in snow ,"
    assert request.written_prompt == "a cabin <lora:KOHYA_SGM:0.8> in snow <LORA:peft:te=0.5:unet=1.2>, <lora:locon>"
    assert request.prompt == "a cabin <lora:KOHYA_SGM:0.8> in snow <LORA:peft:te=0.5:unet=1.2>, <lora:locon>"
    styled = parse_request("a cabin <lora:peft:-0.4>", style="Cinematic", rules=RULES)  # a tag inside a template
    assert styled.loras == (("peft", -0.4, -0.4),) and "<lora" not in styled.styled_prompt
    assert styled.styled_prompt.startswith("cinematic still a cabin . emotional")


def test_the_loras_field_adds_tags_to_the_written_prompt():
    """The API's and the picker's [name, weight] / [name, te, unet] are written as A1111 tags, so the parameters
    read back with the same LoRAs; an empty name is an unused picker row."""
    request = parse_request("a cabin", loras=[["kohya_sgm", 0.8], ["Peft", 0.5, 1.2], ["", 1.0]], rules=RULES)
    assert request.loras == (("kohya_sgm", 0.8, 0.8), ("peft", 0.5, 1.2))
    assert request.styled_prompt == "a cabin"
    assert request.written_prompt == "a cabin <lora:kohya_sgm:0.8> <lora:peft:0.5:1.2>"
    both = parse_request("a cabin <lora:locon:0.3>", loras=(("peft", "0.7"),), rules=RULES)  # tags first, then field
    assert both.loras == (("locon", 0.3, 0.3), ("peft", 0.7, 0.7))
    assert both.written_prompt == "a cabin <lora:locon:0.3> <lora:peft:0.7>"
    assert parse_request("a cabin", loras=[], rules=RULES).loras == ()
    assert parse_request("a cabin", loras=None, rules=RequestRules()).loras == ()  # no LoRAs offered, none asked


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": "a <lora:nope:1>"}, f"Unknown LoRA 'nope'; the LoRAs offered: {OFFERED}."),
        ({"loras": [["dora", 1]]}, f"Unknown LoRA 'dora'; the LoRAs offered: {OFFERED}."),
        (
            {"prompt": "a <lora:peft:1>", "loras": [["PEFT", 0.5]]},
            "LoRA 'PEFT' is asked for twice; give it once, with one weight.",
        ),
        ({"prompt": "a <lora:peft:abc>"}, "The weight of LoRA 'peft' must be a number from -10 to 10; got 'abc'."),
        ({"prompt": "a <lora:peft:11>"}, "The weight of LoRA 'peft' must be a number from -10 to 10; got '11'."),
        ({"prompt": "a <lora:peft:1:nan>"}, "The weight of LoRA 'peft' must be a number from -10 to 10; got 'nan'."),
        ({"loras": [["peft", True]]}, "The weight of LoRA 'peft' must be a number from -10 to 10; got True."),
        ({"loras": [["peft", None]]}, "The weight of LoRA 'peft' must be a number from -10 to 10; got None."),
        ({"loras": "kohya_sgm"}, 'loras must be a list of [name, weight] pairs, e.g. [["my-style", 0.8]].'),
        ({"loras": [["peft"]]}, "Each item of loras must be [name, weight] or [name, te, unet]; got ['peft']."),
        ({"loras": [[1, 0.5]]}, "Each item of loras must be [name, weight] or [name, te, unet]; got [1, 0.5]."),
        (
            {"rules": RequestRules(), "prompt": "a <lora:peft:1>"},
            "No LoRAs are offered (they come from --lora-dir DIR).",
        ),
    ],
    ids=[
        "unknown-tag",
        "refused-file",
        "twice",
        "not-a-number",
        "too-large",
        "nan",
        "bool",
        "none",
        "not-a-list",
        "short-item",
        "name-not-text",
        "none-offered",
    ],
)
def test_refusals_are_one_sentence(fields, message):
    assert refusal(**fields) == message


def test_at_most_four_at_once():
    rules = RequestRules(loras=("a", "b", "c", "d", "e"))
    assert len(parse_request("x", loras=[[n, 1] for n in "abcd"], rules=rules).loras) == MAX_LORAS == 4
    with pytest.raises(InvalidInput, match=r"^At most 4 LoRAs at once; got 5\.$"):
        parse_request("x <lora:e:1>", loras=[[n, 1] for n in "abcd"], rules=rules)


def test_rules_of_a_config_name_every_file_of_the_directory(lora_dir, tmp_path):
    """Known before the model loads (the CLI checks a request first): every *.safetensors by name; the engine then
    offers those it could read (`Generator.rules`)."""
    assert RequestRules.of(EngineConfig(model="tiny", lora_dir=str(lora_dir))).loras == tuple(
        sorted(LORA_NAMES + LORA_REFUSED)
    )
    assert RequestRules.of(EngineConfig(model="tiny", lora_dir=str(tmp_path / "missing"))).loras == ()
    assert RequestRules.of(EngineConfig(model="tiny")).loras == ()


def test_a_request_with_loras_and_a_picture_travels_as_json_data():
    """On several processes the leader publishes `to_dict()`; each follower rebuilds the same request."""
    request = parse_request(
        "a cabin <lora:peft:0.5:1.2>",
        loras=[["locon", -1]],
        init_image=FIXTURES / "image-input.png",
        mask_image=FIXTURES / "image-mask.png",
        strength=0.6,
        cfg_end=0.5,
        deepcache=3,
        steps=8,
        rules=RULES,
    )
    assert request.init_image is not None and request.mask_image is not None
    assert Request.from_dict(json.loads(json.dumps(request.to_dict()))) == request


# ---- the real engine ------------------------------------------------------------------------------------------------


def case_loras(case: dict) -> list[list]:
    """A fixture case's LoRAs as the API's `loras`: [name, weight] or [name, te, unet] (diffusers' per-component)."""
    return [
        [name, w] if not isinstance(w, dict) else [name, w["text_encoder"], w["unet"]]
        for name, w in case["loras"].items()
    ]


def reference_request(engine, case: dict):
    return engine.request(
        MANIFEST["prompt"],
        guidance_scale=MANIFEST["guidance_scale"],
        seed=MANIFEST["seed"],
        steps=MANIFEST["steps"],
        sampler="Euler",
        loras=case_loras(case),
    )


def image0(result) -> np.ndarray:
    return np.asarray(result.images[0]).astype(np.int16)  # [64, 64, 3]: the case's seed


@pytest.fixture(scope="module")
def targets(feature_engine):
    """The engine's kernels and their names in LoRA files (diffusers' PEFT names: the fixture manifest's)."""
    return lora_targets(dataclasses.asdict(feature_engine.programs.modules.unet.config), feature_engine._params)


def to_pytorch_stats(flax_delta: np.ndarray) -> np.ndarray:
    """(Σ D, Σ D², Σ D · cos(o + 2i + 3h + 5w)) of a change in PyTorch's layout, as the fixture script computes them."""
    delta = flax_delta.T if flax_delta.ndim == 2 else flax_delta.transpose(3, 2, 0, 1)
    grids = np.meshgrid(*(np.arange(n) for n in delta.shape), indexing="ij")
    probe = np.cos(sum(f * g for f, g in zip((1, 2, 3, 5), grids, strict=False)))
    return np.array([delta.sum(), (delta**2).sum(), (delta * probe).sum()])


def test_the_engine_offers_the_files_it_could_read(feature_engine):
    assert feature_engine.rules.loras == LORA_NAMES
    assert feature_engine.program_keys()[0].label == "merge"
    with pytest.raises(InvalidInput, match=f"^Unknown LoRA 'dora'; the LoRAs offered: {OFFERED}\\.$"):
        feature_engine.request("a cabin <lora:dora:1>")


@pytest.mark.parametrize("name", sorted(set(CASES) - {"base"}))
def test_engine_images_with_fixture_loras_match_pytorch(feature_engine, targets, name):
    """Each fixture LoRA, two at once with one negative, and split text-encoder/UNet weights: the real engine's
    image within 1 level of diffusers'; the merged kernels changed by what PEFT's get_delta_weight says; the
    parameters name every LoRA as A1111 does (tags, and `Lora hashes` of the bytes after the header)."""
    case = CASES[name]
    before = feature_engine.compile_count
    base = feature_engine.generate(reference_request(feature_engine, CASES["base"]))
    result = feature_engine.generate(reference_request(feature_engine, case))
    expected = np.round(ARRAYS[name][0] * 255)
    assert np.abs(image0(result) - expected).max() <= 1, name
    assert np.mean(image0(result) != expected) < 0.02, name
    assert np.abs(image0(result) - image0(base)).mean() > 5, f"{name} should change the image by many levels"
    assert feature_engine.compile_count == before

    sets = feature_engine.loras
    request = reference_request(feature_engine, case)
    assert sets.current == request.loras
    merged = jax.device_get(get_leaves(sets.params_for(request.loras), sets.layout.leaves))  # no merge: the same set
    originals = jax.device_get(get_leaves(sets.params_for(()), sets.layout.leaves))
    peft_name = {leaf: module for module, leaf in targets.peft.items()}
    rows = {module: i for i, module in enumerate(MANIFEST["delta_modules"])}
    expected_stats = ARRAYS[f"delta/{name}"]
    got_stats = np.zeros_like(expected_stats)
    for leaf, got, original in zip(sets.layout.leaves, merged, originals, strict=True):
        if peft_name.get(leaf) in rows:
            got_stats[rows[peft_name[leaf]]] = to_pytorch_stats(np.asarray(got, np.float64) - original)
    np.testing.assert_allclose(got_stats, expected_stats, rtol=2e-3, atol=2e-5, err_msg=name)

    prompt, _, settings = result.parameters[0].partition("\n")
    assert prompt == request.written_prompt and prompt.count("<lora:") == len(case["loras"])
    hashes = ", ".join(f"{n}: {addnet_hash(n)[:12]}" for n in case["loras"])
    assert settings.endswith(f'Lora hashes: "{hashes}"'), settings
    read_back_by_sd_parsers(result, request.written_prompt, hashes)


def read_back_by_sd_parsers(result, prompt: str, hashes: str) -> None:
    """sd-parsers (what image browsers use to read A1111's metadata) reads the PNG as A1111's, the prompt with its
    tags and the sampler settings. It splits the settings line on every comma and colon, so no quoted value (A1111's
    own `Lora hashes` included) survives it whole; A1111's own reading (the page's PNG Info) gets it whole."""
    import tempfile

    from sd_parsers import ParserManager

    from pipeline.contract.image_files import read_parameters, save_png, to_pil
    from pipeline.contract.parameters import parse_infotext

    with tempfile.TemporaryDirectory() as folder:
        image = to_pil(np.asarray(result.images[0])[None], [result.parameters[0]])[0]
        path = save_png(image, f"{folder}/lora.png")
        info = ParserManager().parse(path)
        text = read_parameters(path)
    assert info is not None and info.generator.value == "AUTOMATIC1111"
    (sampler,) = info.samplers
    assert [p.value for p in sampler.prompts] == [prompt] and sampler.name == "Euler"
    assert sampler.parameters["seed"] == "7" and sampler.model.name == "tiny-pt"
    assert info.raw_parameters["parameters"] == text == result.parameters[0]
    assert parse_infotext(text).settings["Lora hashes"] == hashes


def addnet_hash(name: str) -> str:
    """A1111's LoRA hash: sha256 of the file's bytes after its safetensors header."""
    data = (FIXTURES / "lora" / f"{name}.safetensors").read_bytes()
    return hashlib.sha256(data[8 + int.from_bytes(data[:8], "little") :]).hexdigest()


def test_switching_sets_restores_exactly_and_never_accumulates(feature_engine):
    """Merges start from the unmerged kernels each time: A, B, A gives A's pixels again bit for bit; no LoRA after
    LoRAs serves the unmerged weights themselves; weight 0 merges to the original kernels bit for bit (a select,
    not + 0), and a text-encoder weight of 0 leaves the text encoders' kernels untouched."""
    sets = feature_engine.loras
    before = feature_engine.compile_count

    def run(loras) -> np.ndarray:
        result = feature_engine.generate(feature_engine.request("a lighthouse", seed=11, steps=2, loras=loras))
        return np.stack([np.asarray(image) for image in result.images])

    base = run([])
    first = run([["kohya_sgm", 0.9], ["locon", -0.5]])
    other = run([["peft", 1.3]])
    assert not np.array_equal(first, other) and not np.array_equal(first, base)
    np.testing.assert_array_equal(run([["kohya_sgm", 0.9], ["locon", -0.5]]), first)
    np.testing.assert_array_equal(run([]), base)
    originals = jax.device_get(get_leaves(sets.params_for(()), sets.layout.leaves))
    np.testing.assert_array_equal(run([["kohya_sgm", 0], ["peft", 0, 0]]), base)
    for got, original in zip(
        jax.device_get(get_leaves(sets.params_for(sets.current), sets.layout.leaves)), originals, strict=True
    ):
        np.testing.assert_array_equal(got.view(np.uint32), original.view(np.uint32))  # -0.0 stays -0.0
    run([["kohya_sgm", 0, 1.5]])  # UNet only
    merged = jax.device_get(get_leaves(sets.params_for(sets.current), sets.layout.leaves))
    for leaf, got, original in zip(sets.layout.leaves, merged, originals, strict=True):
        if leaf[0] == "unet":
            continue
        np.testing.assert_array_equal(got.view(np.uint32), original.view(np.uint32), err_msg=str(leaf))
    assert any(
        not np.array_equal(got, o)
        for leaf, got, o in zip(sets.layout.leaves, merged, originals, strict=True)
        if leaf[0] == "unet"
    )
    assert feature_engine.compile_count == before


def test_lora_cache_keeps_that_many_placed_and_merges_the_same(feature_engine):
    """`--lora-cache N`: at most N LoRAs' factors stay placed; fewer placed never changes what is merged."""
    from pipeline.host.lora_sets import LoraSets

    served = feature_engine.loras
    small = LoraSets(
        list(served.files.values()),
        served.layout,
        feature_engine.programs,
        feature_engine._params,
        feature_engine._put_all,
        placed=2,
    )
    before = feature_engine.compile_count
    for choice in ((("kohya_sgm", 0.8, 0.8),), (("peft", 0.5, 0.5), ("locon", -0.6, -0.6)), (("kohya_sgm", 1.0, 1.0),)):
        got = jax.device_get(get_leaves(small.params_for(choice), served.layout.leaves))
        want = jax.device_get(get_leaves(served.params_for(choice), served.layout.leaves))
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), choice
        assert len(small._placed) <= 2
    assert feature_engine.compile_count == before
    with pytest.raises(InvalidInput, match="Lora cache must be a positive whole number"):
        EngineConfig(lora_cache=0)
