"""Makes tests/fixtures/esrgan/: tiny seeded RRDBNet (ESRGAN) files in both PyTorch layouts, and torch's outputs.

Run in a separate torch environment (never by CI): `python scripts/make_esrgan_fixtures.py`. The torch RRDBNet below
is basicsr's `rrdbnet_arch.py` (the code Real-ESRGAN ships), with `upsamples` added for the original ESRGAN's ×2
models (one upsample). Each model is tiny (8 features, growth 4, 1-2 RRDBs, tens of KB):

    tiny-x4.safetensors   new layout (conv_first, body.N.rdb1.conv1, ...), ×4, 2 RRDBs
    tiny-x2.pth           new layout inside {"params_ema": ...} (Real-ESRGAN's x2plus wrapper), pixel-unshuffle 2
    tiny-old-x4.pth       old ESRGAN layout (model.0, model.1.sub.N.RDB1.conv1.0, model.3 ...), ×4, 1 RRDB
    tiny-old-x2.safetensors  old layout with one upsample (×2), 1 RRDB
    legacy.pth            tiny-old-x4's weights in torch's legacy (non-zip) format: the loader refuses it

and expected.npz: for each model, `in_<stem>` (1, 3, h, w) in [0, 1] and `out_<stem>` torch's output.
tests/engine/test_esrgan.py loads each file with pipeline/checkpoint/upscaler_loading.py and compares.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "esrgan"


class ResidualDenseBlock(nn.Module):
    def __init__(self, num_feat: int, num_grow_ch: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(num_feat, num_grow_ch, 3, 1, 1)
        self.conv2 = nn.Conv2d(num_feat + num_grow_ch, num_grow_ch, 3, 1, 1)
        self.conv3 = nn.Conv2d(num_feat + 2 * num_grow_ch, num_grow_ch, 3, 1, 1)
        self.conv4 = nn.Conv2d(num_feat + 3 * num_grow_ch, num_grow_ch, 3, 1, 1)
        self.conv5 = nn.Conv2d(num_feat + 4 * num_grow_ch, num_feat, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2)

    def forward(self, x):
        x1 = self.lrelu(self.conv1(x))
        x2 = self.lrelu(self.conv2(torch.cat((x, x1), 1)))
        x3 = self.lrelu(self.conv3(torch.cat((x, x1, x2), 1)))
        x4 = self.lrelu(self.conv4(torch.cat((x, x1, x2, x3), 1)))
        x5 = self.conv5(torch.cat((x, x1, x2, x3, x4), 1))
        return x5 * 0.2 + x


class RRDB(nn.Module):
    def __init__(self, num_feat: int, num_grow_ch: int) -> None:
        super().__init__()
        self.rdb1 = ResidualDenseBlock(num_feat, num_grow_ch)
        self.rdb2 = ResidualDenseBlock(num_feat, num_grow_ch)
        self.rdb3 = ResidualDenseBlock(num_feat, num_grow_ch)

    def forward(self, x):
        return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x


class RRDBNet(nn.Module):
    def __init__(self, scale: int, num_feat: int, num_block: int, num_grow_ch: int, upsamples: int = 2) -> None:
        super().__init__()
        self.scale = scale
        num_in_ch = 3 * {4: 1, 2: 4, 1: 16}[scale] if upsamples == 2 else 3
        self.conv_first = nn.Conv2d(num_in_ch, num_feat, 3, 1, 1)
        self.body = nn.Sequential(*[RRDB(num_feat, num_grow_ch) for _ in range(num_block)])
        self.conv_body = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.ups = nn.ModuleList([nn.Conv2d(num_feat, num_feat, 3, 1, 1) for _ in range(upsamples)])
        self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_last = nn.Conv2d(num_feat, 3, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2)
        self.unshuffle = {4: 1, 2: 2, 1: 4}[scale] if upsamples == 2 else 1

    def forward(self, x):
        feat = F.pixel_unshuffle(x, self.unshuffle) if self.unshuffle > 1 else x
        feat = self.conv_first(feat)
        feat = feat + self.conv_body(self.body(feat))
        for conv in self.ups:
            feat = self.lrelu(conv(F.interpolate(feat, scale_factor=2, mode="nearest")))
        return self.conv_last(self.lrelu(self.conv_hr(feat)))

    def new_layout(self) -> OrderedDict:
        """basicsr's names: conv_up1/conv_up2 for the upsample convs."""
        state = OrderedDict()
        for key, value in self.state_dict().items():
            if key.startswith("ups."):
                index, rest = key[len("ups.") :].split(".", 1)
                key = f"conv_up{int(index) + 1}.{rest}"
            state[key] = value
        return state

    def old_layout(self) -> OrderedDict:
        """The original ESRGAN's nn.Sequential indices: model.0 conv_first, model.1.sub.N.RDBk.convj.0 the RRDBs,
        model.1.sub.<blocks> conv_body, then (Upsample, conv, LeakyReLU) per upsample, conv_hr, LeakyReLU,
        conv_last."""
        blocks = len(self.body)
        index = {"conv_first": "model.0", "conv_body": f"model.1.sub.{blocks}"}
        for i in range(len(self.ups)):
            index[f"ups.{i}"] = f"model.{3 + 3 * i}"
        index["conv_hr"] = f"model.{3 + 3 * len(self.ups)}"
        index["conv_last"] = f"model.{5 + 3 * len(self.ups)}"
        state = OrderedDict()
        for key, value in self.state_dict().items():
            if key.startswith("body."):
                _, n, rdb, conv, kind = key.split(".")
                key = f"model.1.sub.{n}.RDB{rdb[-1]}.{conv}.0.{kind}"
            else:
                module, kind = key.rsplit(".", 1)
                key = f"{index[module]}.{kind}"
            state[key] = value
        return state


MODELS = {  # stem: (scale, blocks, upsamples, layout, input side)
    "tiny-x4": (4, 2, 2, "new", 12),
    "tiny-x2": (2, 1, 2, "new", 12),
    "tiny-old-x4": (4, 1, 2, "old", 10),
    "tiny-old-x2": (2, 1, 1, "old", 10),
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for seed, (stem, (scale, blocks, upsamples, layout, side)) in enumerate(MODELS.items()):
        torch.manual_seed(47 + seed)
        model = RRDBNet(scale, num_feat=8, num_block=blocks, num_grow_ch=4, upsamples=upsamples).eval()
        with torch.no_grad():  # outputs around mid-grey, not clipped to 0 as random weights' mostly would be
            model.conv_last.bias += 0.5
        state = model.new_layout() if layout == "new" else model.old_layout()
        state = OrderedDict((key, value.detach().clone().contiguous()) for key, value in state.items())
        if stem.endswith("x2") and layout == "new":
            torch.save({"params_ema": state}, OUT / f"{stem}.pth")
        elif layout == "old" and upsamples == 2:
            torch.save(state, OUT / f"{stem}.pth")
            torch.save(state, OUT / "legacy.pth", _use_new_zipfile_serialization=False)
        else:
            save_file(dict(state), str(OUT / f"{stem}.safetensors"))
        image = torch.from_numpy(np.random.default_rng(seed).random((1, 3, side, side), dtype=np.float32))
        with torch.no_grad():
            arrays[f"in_{stem}"] = image.numpy()
            arrays[f"out_{stem}"] = model(image).numpy()
    np.savez_compressed(OUT / "expected.npz", **arrays)
    print(f"wrote {OUT} ({len(arrays)} arrays, torch {torch.__version__})")


if __name__ == "__main__":
    main()
