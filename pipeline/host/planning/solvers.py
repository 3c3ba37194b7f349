"""Each sampler as rows of one update, from its sigmas: what diffusers' PyTorch schedulers compute, rewritten in the
engine's "variance exploding" scale (x = x0 + sigma·noise; the UNet sees x / sqrt(sigma^2 + 1)).

One row per UNet call (`plan.COEFFICIENTS`):

    x' = a·x + b·D + c·H[0] + h1·H[1] + h2·H[2] + h3·H[3] + d·noise      e = p·x + q·D,   H' = [D, e, H[1], H[2]]

D is the step's denoised prediction, H the history the step program carries (H[0] the last D, H[1..3] the last
three entries e). Every sampler is linear in these, so one compiled step serves them all:

- Euler, Euler a, DDIM (eta 0: Euler on DDIM's timesteps), LCM (x' = c_skip·x_VP + c_out·D + sigma'·noise): one step
  from (x, D) and the step's own noise.
- DPM++ 2M and DPM++ 2M SDE (dpmsolver++ / sde-dpmsolver++, order 2, midpoint): D and the last D.
- UniPC (bh2, order 2, corrector on): the corrector re-solves the last step with this step's D, so the next sample
  is linear in the last three D (H[0] and H[2], with e = D).
- LMS (order 4): the last four derivatives (x - D) / sigma (e = that derivative).
- Heun: two rows per step, an Euler row to sigma', then x' = x_mid + (sigma' - sigma)/(2 sigma')·(D1 - D2) (D1 in
  H[0]); its last step is one Euler row, as in diffusers.

`first`: the first step run (an image request's), where a multistep sampler starts with no history, as diffusers'
schedulers do after `set_begin_index`.
"""

from __future__ import annotations

import numpy as np

WIDTH = 13  # len(plan.COEFFICIENTS)
X, D, PREV, NOISE, H1, H2, H3, KEEP_X, KEEP_D, CLIP, UNCLIPPED = range(2, 13)


def _table(sigmas: np.ndarray) -> np.ndarray:
    """float64 [n, WIDTH] with the timestep column left for the caller and each row's sigma set."""
    table = np.zeros((len(sigmas) - 1, WIDTH), np.float64)
    table[:, 1] = sigmas[:-1]
    return table


def euler(sigmas: np.ndarray, first: int = 0) -> np.ndarray:
    """x' = (s'/s)·x + (1 - s'/s)·D."""
    table = _table(sigmas)
    ratio = sigmas[1:] / sigmas[:-1]
    table[:, X], table[:, D] = ratio, 1 - ratio
    return table


def euler_ancestral(sigmas: np.ndarray, first: int = 0) -> np.ndarray:
    """Euler towards sigma_down, plus sigma_up·noise."""
    table = _table(sigmas)
    for i, (sigma, sigma_next) in enumerate(zip(sigmas[:-1], sigmas[1:], strict=True)):
        sigma_up = (sigma_next**2 * (sigma**2 - sigma_next**2) / sigma**2) ** 0.5
        sigma_down = max(sigma_next**2 - sigma_up**2, 0.0) ** 0.5
        table[i, X], table[i, D], table[i, NOISE] = sigma_down / sigma, 1 - sigma_down / sigma, sigma_up
    return table


def dpmpp_2m(sigmas: np.ndarray, first: int = 0, sde: bool = False) -> np.ndarray:
    """DPM-Solver++(2M), lower order at the first step run and at the final step (final sigma 0). With r = s'/s,
    h = log(s/s'), r0 = h_prev/h: ODE x' = r·x + (1 - r)·(D + (D - D_prev)/(2·r0)); SDE x' = r²·x +
    (1 - r²)·(D + (D - D_prev)/(2·r0)) + s'·sqrt(1 - r²)·noise."""
    table = _table(sigmas)
    steps = len(sigmas) - 1
    for i in range(steps):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        ratio = sigma_next / sigma
        keep, noise = (ratio**2, sigma_next * (1 - ratio**2) ** 0.5) if sde else (ratio, 0.0)
        table[i, X], table[i, NOISE] = keep, noise
        if first < i < steps - 1:
            half_over_r0 = 0.5 * np.log(sigma / sigma_next) / np.log(sigmas[i - 1] / sigma)
            table[i, D], table[i, PREV] = (1 - keep) * (1 + half_over_r0), -(1 - keep) * half_over_r0
        else:
            table[i, D] = 1 - keep
    return table


def dpmpp_2m_sde(sigmas: np.ndarray, first: int = 0) -> np.ndarray:
    return dpmpp_2m(sigmas, first, sde=True)


def _unipc_rhos_c(rk: float | None, hh: float, b_h: float) -> np.ndarray:
    """UniC's rhos for order 1 (rk None) or 2, as `multistep_uni_c_bh_update` solves them."""
    if rk is None:
        return np.array([0.5])
    h_phi_k, factorial, b = np.expm1(hh) / hh - 1, 1, []
    for i in range(1, 3):
        b.append(h_phi_k * factorial / b_h)
        factorial *= i + 1
        h_phi_k = h_phi_k / hh - 1 / factorial
    rks = np.array([rk, 1.0])
    return np.linalg.solve(np.stack([rks**0, rks**1]), np.array(b))


def unipc(sigmas: np.ndarray, first: int = 0) -> np.ndarray:
    """UniPC (bh2, order 2, data prediction, lower order final, corrector at every step but the first run).

    Predictor from x_c at step i: x_p' = r·x_c + (1 - r)·D_i - (r - 1)·rho_p·(D_i-1 - D_i)/rk (order 2), with
    rho_p = 1/2. Corrector at step i, over the interval i-1 -> i and the order the predictor had there: x_c =
    x_p + B·[(rho_p - rho_c0)·(D_i-2 - D_i-1)/rk_c - rho_c1·(D_i - D_i-1)] (order 1: -B·(D_i - D_i-1)/2).
    """
    table = _table(sigmas)
    steps = len(sigmas) - 1
    lambdas = -np.log(np.maximum(sigmas, 1e-300))  # the last one (sigma 0) is never read as a lambda
    order = [min(2, steps - i, i - first + 1) for i in range(steps)]
    for i in range(steps):
        ratio = sigmas[i + 1] / sigmas[i]
        # the predictor: weights on x_c, D_i, D_i-1
        pred_x, pred_d, pred_prev = ratio, 1 - ratio, 0.0
        if order[i] == 2:
            rk = (lambdas[i - 1] - lambdas[i]) / (lambdas[i + 1] - lambdas[i])
            pred_d += (ratio - 1) * 0.5 / rk
            pred_prev = -(ratio - 1) * 0.5 / rk
        # the corrector of x_i: x_c = x_p + (weights on D_i, D_i-1, D_i-2)
        corr_d = corr_prev = corr_prev2 = 0.0
        if i > first:
            h = lambdas[i] - lambdas[i - 1]
            b_h = np.expm1(-h)
            rk_c = (lambdas[i - 2] - lambdas[i - 1]) / h if order[i - 1] == 2 else None
            rhos = _unipc_rhos_c(rk_c, -h, b_h)
            corr_d, corr_prev = -b_h * rhos[-1], b_h * rhos[-1]
            if rk_c is not None:
                weight = b_h * (0.5 - rhos[0]) / rk_c
                corr_prev -= weight
                corr_prev2 = weight
        table[i, X] = pred_x
        table[i, D] = pred_x * corr_d + pred_d
        table[i, PREV] = pred_x * corr_prev + pred_prev
        table[i, H2] = pred_x * corr_prev2
        table[i, KEEP_D] = 1.0  # e = D
    return table


#: 2-point Gauss-Legendre nodes and weights on [-1, 1]: exact for LMS's polynomials (degree <= 3, order <= 4).
_GAUSS_NODES, _GAUSS_WEIGHTS = np.polynomial.legendre.leggauss(2)


def _lms_coefficient(sigmas: np.ndarray, order: int, i: int, current: int) -> float:
    """∫ from sigma_i to sigma_i+1 of the Lagrange basis polynomial of node i - current over nodes i .. i-order+1
    (diffusers' `get_lms_coefficient`, which integrates it numerically; here exactly, by Gauss-Legendre)."""
    low, high = sigmas[i], sigmas[i + 1]
    taus = (high - low) / 2 * _GAUSS_NODES + (high + low) / 2
    product = np.ones_like(taus)
    for k in range(order):
        if k != current:
            product *= (taus - sigmas[i - k]) / (sigmas[i - current] - sigmas[i - k])
    return float((high - low) / 2 * np.dot(_GAUSS_WEIGHTS, product))


def lms(sigmas: np.ndarray, first: int = 0, max_order: int = 4) -> np.ndarray:
    """LMS: x' = x + Σ_k c_k·d_i-k, d = (x - D)/sigma, the polynomial's order min(i + 1, 4) and as many derivatives
    as the run has made (diffusers keeps both counts apart: an image request's first step uses c_0 alone)."""
    table = _table(sigmas)
    for i in range(len(sigmas) - 1):
        order = min(i + 1, max_order)
        made = max(1, i - first + 1)  # derivatives the run has made (rows before `first` are never run)
        coefficients = [_lms_coefficient(sigmas, order, i, k) for k in range(min(order, made))]
        table[i, X] = 1 + coefficients[0] / sigmas[i]
        table[i, D] = -coefficients[0] / sigmas[i]
        for k, column in zip(range(1, len(coefficients)), (H1, H2, H3), strict=False):
            table[i, column] = coefficients[k]
        table[i, KEEP_X], table[i, KEEP_D] = 1 / sigmas[i], -1 / sigmas[i]
    return table


def heun(timesteps: np.ndarray, sigmas: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Heun's rows: (timesteps [2n-1], sigmas [2n], table [2n-1, WIDTH]), interleaved as `HeunDiscreteScheduler`
    does: an Euler row from s_k to s_k+1, then the correction at s_k+1; the last step is one Euler row."""
    steps = len(timesteps)
    row_t = np.concatenate([timesteps[:1], np.repeat(timesteps[1:], 2)])
    row_sigmas = np.concatenate([sigmas[:1], np.repeat(sigmas[1:-1], 2), sigmas[-1:]])
    table = _table(row_sigmas)
    for k in range(steps):
        sigma, sigma_next = sigmas[k], sigmas[k + 1]
        first_row = 2 * k
        table[first_row, X], table[first_row, D] = sigma_next / sigma, 1 - sigma_next / sigma
        if k < steps - 1:
            half = 0.5 * (sigma_next - sigma) / sigma_next
            table[first_row + 1, X], table[first_row + 1, D], table[first_row + 1, PREV] = 1.0, -half, half
    table[:, 0] = row_t
    return row_t, row_sigmas, table


def ddim(sigmas: np.ndarray, after: np.ndarray) -> np.ndarray:
    """DDIM (eta 0): x_VP' = sqrt(alpha_prev)·(D + s_prev·eps), with s_prev the level of t - T/steps (`after`), which
    is not the next row's level with every spacing. In the engine's scale the next row reads its latents at its own
    level s' (the last row: 0, the sample itself, which is what PyTorch decodes), so the row is Euler to s_prev
    times sqrt(s'^2 + 1)/sqrt(s_prev^2 + 1). `sigmas`: the rows' levels [n]; `after`: each row's s_prev [n]."""
    levels = np.concatenate([sigmas, [0.0]])
    table = _table(levels)
    ratio = after / sigmas
    rescale = ((levels[1:] ** 2 + 1) / (after**2 + 1)) ** 0.5
    table[:, X], table[:, D] = rescale * ratio, rescale * (1 - ratio)
    return table


def clip(table: np.ndarray, sample_range: float, noise_from_model: bool) -> None:
    """`clip_sample`: D clipped to ±sample_range. DDIM (`noise_from_model`) still steps along the model's own noise:
    x' = k·(D_clipped + s_prev·eps), eps = (x - D)/s, so the row's weight on D goes to the clipped D and its share of
    the noise direction, -(a), to the unclipped D. LCM's boundary condition reads the clipped D only."""
    table[:, CLIP] = sample_range
    if noise_from_model:
        table[:, D], table[:, UNCLIPPED] = table[:, D] + table[:, X], -table[:, X]


def lcm(timesteps: np.ndarray, sigmas: np.ndarray, timestep_scaling: float = 10.0) -> np.ndarray:
    """LCM: denoised = c_skip·x_VP + c_out·D (its boundary condition), then x' = denoised + s'·noise (none after the
    last step), with c_skip = 0.25/(T² + 0.25), c_out = T/sqrt(T² + 0.25), T = 10·t."""
    table = _table(sigmas)
    scaled = timesteps.astype(np.float64) * timestep_scaling
    c_skip, c_out = 0.25 / (scaled**2 + 0.25), scaled / (scaled**2 + 0.25) ** 0.5
    table[:, X] = c_skip / (sigmas[:-1] ** 2 + 1) ** 0.5
    table[:, D] = c_out
    table[:-1, NOISE] = sigmas[1:-1]
    return table
