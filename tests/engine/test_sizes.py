"""Offered sizes: parsed from --sizes (pipeline/contract/sizes.py), labelled for the page (web/page/size_labels.py),
and a request's size text checked against them (pipeline/contract/fields.py)."""

from __future__ import annotations

import jax
import pytest

from pipeline.contract.errors import InvalidInput
from pipeline.contract.fields import check_size
from pipeline.contract.sizes import default_sizes, parse_sizes
from web.page.size_labels import ratio_name, size_label


def test_size_parsing_and_labels():
    assert parse_sizes("1024x1024, 1344×768") == [(1024, 1024), (768, 1344)]
    for bad in ("1024", "1001x1000", "0x8", "axb", "136x136"):  # 136: a multiple of 8, not of 32
        with pytest.raises(InvalidInput):
            parse_sizes(bad)
    labels = [size_label(h, w) for h, w in default_sizes()]
    assert labels == ["1024×1024 (1:1)", "1344×768 (16:9)", "768×1344 (9:16)"]
    every = [size_label(h, w) for h, w in parse_sizes("sdxl")]
    assert len(every) == 9 and every[0] == "1024×1024 (1:1)" and "640×1536 (9:21)" in every
    for every in (False, True):
        tiny, full = default_sizes(tiny=True, every=every), default_sizes(every=every)
        if not every:  # the default offer's ratios survive the scaling; 21:9 at 128 px is 320×128, labelled 5:2
            assert [ratio_name(h, w) for h, w in tiny] == [ratio_name(h, w) for h, w in full]
        for h, w in tiny + full:  # every label names a true ratio (issue 20: 160×96 was called 16:9)
            a, b = (int(n) for n in ratio_name(h, w).split(":"))
            assert abs(w / h - a / b) / (a / b) < 0.03, (w, h, a, b)
        assert all(h % 32 == 0 and w % 32 == 0 and min(h, w) == 128 for h, w in tiny)
    assert parse_sizes("SDXL", tiny=True) == default_sizes(tiny=True, every=True)
    sizes = [(64, 64), (128, 224)]
    assert check_size("224×128 (16:9)", sizes) == check_size("224x128", sizes) == (128, 224)
    assert check_size(None, sizes) == (64, 64)
    with pytest.raises(InvalidInput, match="not offered"):
        check_size("1344×768 (16:9)", sizes)
    # A ratio names the offered size of that shape, whatever the model: one call for SDXL and the tiny model.
    assert check_size("16:9", sizes) == check_size(" 7 : 4 ", sizes) == (128, 224)
    assert check_size("1:1", sizes) == (64, 64)
    assert check_size("16:9", default_sizes()) == (768, 1344) and check_size("9:16", default_sizes()) == (1344, 768)
    for far in ("9:16", "4:3", "0:1", "1:0", "16/9"):  # not within 10% of an offered shape, or not a ratio
        with pytest.raises(InvalidInput, match=r"not offered by this server; choose one of: 64×64, 224×128 \(or"):
            check_size(far, sizes)
    assert jax.device_count() == 8
