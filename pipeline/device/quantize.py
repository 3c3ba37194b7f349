"""The UNet in int8 (experimental, `--quantize int8`): qwix post-training quantization of its Dense and Conv layers.

    unet_params = quantize_unet_params(unet, params["unet"])    # once, on the host: int8 kernels + scales
    modules = replace(modules, unet=quantized_unet(unet))       # the traced step runs the int8 ops

Why int8 activations too: a v5e's MXU multiplies int8 x int8 at 393 TOPS, twice its bf16 peak, and only when both
operands are int8; an int8 weight times a bf16 activation is dequantized first and gains nothing but weight bytes.
So every Dense (attention projections, feed-forward, embeddings) and Conv of the UNet runs int8 x int8 with
int32 accumulation: weights quantized once (symmetric absmax, one scale per output channel), activations quantized
on the fly per call (dynamic range: absmax per row / per pixel, qwix's default for XLA). The attention core (QK^T,
PV), the norms and the nonlinearities stay in the network dtype, as do `conv_in` (4 input channels: no MXU gain,
the most sensitive layer) and `conv_out` (the noise prediction itself). The text encoders and the VAE are not
touched. NVIDIA's MLPerf SDXL entries quantize the same layers (INT8 SmoothQuant, then FP8).

qwix (google/qwix) intercepts `jax.lax.dot_general` / `conv_general_dilated` inside the module's `__call__`, so
the UNet (`nets/unet.py`) is used as written, with DeepCache's and the attention core's method interceptors on top.
Quality on real SDXL weights is unmeasured here (MLPerf's FID / CLIP-score bounds are the test a TPU run needs).

Imported inside functions: qwix (optional: only `--quantize int8` needs it, and a machine with the engine's
packages alone has none (pipeline/installed.py's ENGINE); 2 s to import).
"""

from __future__ import annotations

import jax
import numpy as np

#: UNet layers left in the network dtype (regexes on the module path; the first matching rule wins in qwix).
KEEP = r"conv_in|conv_out"


def _rules():
    import qwix

    keep = qwix.QuantizationRule(module_path=KEEP)  # no qtype: the plain op
    int8 = qwix.QuantizationRule(
        module_path=".*", op_names=("dot_general", "conv_general_dilated"), weight_qtype="int8", act_qtype="int8"
    )
    return [keep, int8]


def quantized_unet(unet):
    """`unet` (nets/unet.UNet2DConditionModel) whose Dense and Conv layers run int8 x int8 (module docstring).

    qwix gives the module a new class with the same fields, its config among them (DeepCache's cut reads it)."""
    import qwix

    return qwix.quantize_model(unet, qwix.PtqProvider(_rules()))


def quantize_unet_params(unet, params) -> dict:
    """`params` (the UNet's, host arrays in the network dtype) with every quantized kernel as int8 + per-channel
    scales (qwix's `WithAux(QArray)` leaves), as host numpy arrays, ready to be placed like any other weights.

    Computed on the host's CPU device where JAX has one, so an accelerator holds only the int8 copy; as one jitted
    program: run op by op, qwix's absmax, scale, round and cast (and `jnp.asarray` placing each array) compiled
    small programs for each kernel's shape (160 compiles for the tiny UNet, 6.5 of 9 CPU seconds of quantizing it;
    one program now, the same int8 kernels and scales to the bit)."""
    import qwix

    abstract = jax.eval_shape(quantized_unet(unet).init_weights, jax.random.PRNGKey(0))
    try:
        device = jax.devices("cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS without cpu: the default device
        device = None
    with jax.default_device(device):
        quantized = jax.jit(lambda weights: qwix.quantize_params(weights, abstract))(params)
        return jax.tree_util.tree_map(np.asarray, quantized)
