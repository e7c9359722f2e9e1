"""Gaussian diffusion written from the equations: schedule, hybrid loss, VLB in bits/dim, samplers.

Notation (T steps, t = 0 .. T-1, all tensors [B, C, H, W] unless stated):

    beta_t (linear schedule), alpha_t = 1 - beta_t, abar_t = prod_{s<=t} alpha_s, abar_{-1} = 1
    forward     q(x_t | x_0)       = N(sqrt(abar_t) x_0, (1 - abar_t) I)                         (Ho et al. Eq. 4)
    posterior   q(x_{t-1} | x_t, x_0) = N(c0_t x_0 + ct_t x_t, btilde_t I),
                c0_t = beta_t sqrt(abar_{t-1}) / (1 - abar_t),  ct_t = sqrt(alpha_t)(1 - abar_{t-1}) / (1 - abar_t),
                btilde_t = beta_t (1 - abar_{t-1}) / (1 - abar_t)                                  (Ho et al. Eq. 6-7)
    model       output [B, 2C, H, W] = (eps, v):  x0_hat = (x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t),
                p(x_{t-1} | x_t) = N(c0_t x0_hat + ct_t x_t, Sigma_t),
                log Sigma_t = f log beta_t + (1 - f) log btilde_t,  f = (v + 1) / 2       (Nichol & Dhariwal Eq. 15)
                (f = (v + 1) / 2 so that a zero-initialised output head starts halfway between the two bounds;
                btilde_0 = 0, so its log is clipped to log btilde_1, as in improved DDPM.)
    loss        L_hybrid = L_simple + lambda L_vlb,  lambda = 0.001                        (Nichol & Dhariwal Eq. 16)
                L_simple = mean ||eps - eps_hat||^2;  L_vlb = sum_t L_t, estimated from the uniformly sampled t
                by T * L_t, so the per-sample term is lambda * T * L_t (= L_t for T = 1000). L_t uses the mean
                with a stop-gradient (only Sigma learns from it). L_t for t > 0 is KL(q posterior || p), for t = 0 the
                discretised Gaussian decoder NLL; both in bits per dimension (mean over C, H, W).
    respacing   kept steps s_0 < ... < s_{K-1}:  beta'_i = 1 - abar_{s_i} / abar_{s_{i-1}}, so the respaced
                process has exactly the marginals q(x_{s_i} | x_0); the model still receives the original s_i.
    DDIM        x_{t-1} = sqrt(abar_{t-1}) x0_hat + sqrt(1 - abar_{t-1} - sigma^2) eps_hat + sigma z,
                sigma = eta sqrt((1 - abar_{t-1}) / (1 - abar_t)) sqrt(1 - abar_t / abar_{t-1})
                                                                                   (Song et al. Eq. 12, 16)

Noise is drawn per sample from its own seeded generator (:class:`SampleNoise`), so a sample depends only on its
seed: not on the batch it shares, the device count, or the rank that draws it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

ModelFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``model_fn(x_t [B, C, H, W], t [B] long) -> [B, 2C, H, W]`` (eps, v) or ``[B, C, H, W]`` (eps only, fixed
variance)."""

LN2 = math.log(2.0)
SAMPLERS = ("ddpm", "ddim")


def linear_betas(num_steps: int = 1000) -> torch.Tensor:
    """Linear schedule of Ho et al., rescaled to ``num_steps``: beta from 1e-4 to 0.02 for T = 1000 (float64 [T])."""
    scale = 1000.0 / num_steps
    return torch.linspace(scale * 1e-4, scale * 0.02, num_steps, dtype=torch.float64)


def spaced_steps(num_steps: int, spec: int | str) -> list[int]:
    """Steps kept by respacing: ``spec`` (e.g. ``250`` or ``"250"``) steps evenly spread over [0, T-1], both ends
    kept."""
    count = int(spec)
    if not 1 <= count <= num_steps:
        raise ValueError(f"respacing to {count} steps: need 1 <= steps <= {num_steps}")
    if count == 1:
        return [num_steps - 1]
    return sorted({round(i * (num_steps - 1) / (count - 1)) for i in range(count)})


def normal_kl(mean1: torch.Tensor, logvar1: torch.Tensor, mean2: torch.Tensor, logvar2: torch.Tensor) -> torch.Tensor:
    """Elementwise KL(N(mean1, e^logvar1) || N(mean2, e^logvar2)) in nats:
    0.5 (logvar2 - logvar1 + e^(logvar1 - logvar2) + (mean1 - mean2)^2 e^(-logvar2) - 1)."""
    return 0.5 * (logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2) - 1.0)


def discretized_gaussian_log_likelihood(x: torch.Tensor, mean: torch.Tensor, log_scale: torch.Tensor) -> torch.Tensor:
    """Elementwise log-probability (nats) of 8-bit data x in [-1, 1] under N(mean, e^(2 log_scale)) integrated over
    its bin of width 2/255: log [Phi((x + 1/255 - mean)/s) - Phi((x - 1/255 - mean)/s)], with the edge bins open
    (x = -1 takes the whole left tail, x = 1 the whole right tail). Ho et al. Eq. 13."""
    inv_s = torch.exp(-log_scale)
    upper = (x - mean + 1.0 / 255.0) * inv_s
    lower = (x - mean - 1.0 / 255.0) * inv_s
    log_cdf_upper = torch.special.log_ndtr(upper)
    log_sf_lower = torch.special.log_ndtr(-lower)
    mid = torch.log((torch.special.ndtr(upper) - torch.special.ndtr(lower)).clamp_min(1e-12))
    return torch.where(x < -0.999, log_cdf_upper, torch.where(x > 0.999, log_sf_lower, mid))


def t_buckets(num_steps: int, buckets: int) -> list[tuple[int, int]]:
    """``buckets`` contiguous ranges [lo, hi) of t in 0..num_steps-1 of (nearly) equal length; 0 or 1: one range.

    Example:
        >>> t_buckets(1000, 4)
        [(0, 250), (250, 500), (500, 750), (750, 1000)]
    """
    m = max(buckets, 1)
    if m > num_steps:
        raise ValueError(f"{buckets} buckets of t for {num_steps} diffusion steps: use at most {num_steps}")
    return [((i * num_steps) // m, ((i + 1) * num_steps) // m) for i in range(m)]


class SampleNoise:
    """Standard normal noise drawn per sample from its own CPU generator seeded with that sample's seed.

    ``noise(shape)`` returns [len(seeds), *shape] on ``device``; row i depends only on seeds[i] and on how many
    draws came before, so results are independent of batching and of the number of processes.
    """

    def __init__(self, seeds: Sequence[int], device: torch.device | str):
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.device = torch.device(device)

    def __call__(self, shape: Sequence[int]) -> torch.Tensor:
        return self._to_device(torch.stack([torch.randn(tuple(shape), generator=g) for g in self.generators]))

    def uniform(self, shape: Sequence[int]) -> torch.Tensor:
        """U[0, 1) draws [len(seeds), *shape] from the same per-sample generators."""
        return self._to_device(torch.stack([torch.rand(tuple(shape), generator=g) for g in self.generators]))

    def _to_device(self, x: torch.Tensor) -> torch.Tensor:
        """Host draws to the device; to a GPU through pinned memory without waiting for the queued work."""
        if self.device.type == "cuda":
            return x.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device)


def guided(
    model_fn: Callable[..., torch.Tensor],
    y: torch.Tensor,
    null_class: int,
    scale: float,
    guide_channels: int | None = 3,
) -> ModelFn:
    """Classifier-free guidance (Ho & Salimans): eps = eps_u + scale (eps_c - eps_u) over one doubled batch.

    ``model_fn(x, t, y)`` returns [B, 2C, H, W] or [B, C, H, W]. ``guide_channels=3`` guides only the first three
    latent channels (the published DiT convention), ``None`` guides all C; the variance half (if any) is the
    conditional one. Returns ``fn(x, t)`` for the samplers.
    """
    y_null = torch.full_like(y, null_class)

    def fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        out = model_fn(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, y_null]))
        cond, uncond = out.chunk(2)
        k = c if guide_channels is None else min(guide_channels, c)
        eps = cond[:, :c].clone()
        eps[:, :k] = uncond[:, :k] + scale * (cond[:, :k] - uncond[:, :k])
        return torch.cat([eps, cond[:, c:]], dim=1)

    return fn


class GaussianDiffusion:
    """A discrete Gaussian diffusion on ``betas`` (float64 [K]); ``timestep_map[i]`` is the model's timestep for step i.

    ``learn_sigma``: the model predicts (eps, v) and the variance interpolation above; otherwise eps only with
    Sigma_t = btilde_t. ``clip_denoised``: clip x0_hat to [-1, 1] (pixel data) in sampling and the VLB.
    """

    def __init__(
        self,
        betas: torch.Tensor,
        *,
        learn_sigma: bool = True,
        vlb_weight: float = 0.001,
        clip_denoised: bool = False,
        timestep_map: Sequence[int] | None = None,
        num_train_steps: int | None = None,
    ):
        betas = torch.as_tensor(betas, dtype=torch.float64)
        if betas.ndim != 1 or not bool(((betas > 0) & (betas <= 1)).all()):
            raise ValueError("betas must be a 1-D tensor with values in (0, 1]")
        self.betas = betas
        self.num_steps = len(betas)
        self.num_train_steps = num_train_steps or self.num_steps
        self.learn_sigma = learn_sigma
        self.vlb_weight = vlb_weight
        self.clip_denoised = clip_denoised
        self.timestep_map = torch.as_tensor(
            list(timestep_map) if timestep_map is not None else range(self.num_steps), dtype=torch.long
        )
        alphas = 1.0 - betas
        self.alphas_cumprod = torch.cumprod(alphas, 0)
        self.alphas_cumprod_prev = torch.cat([torch.ones(1, dtype=torch.float64), self.alphas_cumprod[:-1]])
        self.posterior_variance = betas * (1.0 - self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        clipped = self.posterior_variance.clone()
        if self.num_steps > 1:
            clipped[0] = self.posterior_variance[1]
        else:
            clipped[0] = betas[0]
        self.posterior_log_variance = torch.log(clipped)
        self.posterior_coef_x0 = betas * torch.sqrt(self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        self.posterior_coef_xt = torch.sqrt(alphas) * (1.0 - self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        abar = self.alphas_cumprod
        coefficients = {  # float64 [K], computed once, read per timestep as float32 through _at
            "abar": abar,
            "abar_prev": self.alphas_cumprod_prev,
            "sqrt_abar": abar.sqrt(),
            "sqrt_one_minus_abar": (1.0 - abar).sqrt(),
            "log_one_minus_abar": torch.log(1.0 - abar),
            "rsqrt_abar": torch.rsqrt(abar),
            "sqrt_recipm1_abar": torch.sqrt(1.0 / abar - 1.0),
            "log_betas": torch.log(betas),
            "post_coef_x0": self.posterior_coef_x0,
            "post_coef_xt": self.posterior_coef_xt,
            "post_log_var": self.posterior_log_variance,
        }
        self._tables = {name: values.float() for name, values in coefficients.items()}
        self._tables["timestep_map"] = self.timestep_map
        self._on_device: dict[tuple[str, torch.device], torch.Tensor] = {}

    # ---- construction -------------------------------------------------------------------------------------------
    @classmethod
    def linear(cls, num_steps: int = 1000, **kwargs) -> GaussianDiffusion:
        """The linear-schedule diffusion of DiT / improved DDPM (T = ``num_steps``)."""
        return cls(linear_betas(num_steps), **kwargs)

    def respace(self, spec: int | str) -> GaussianDiffusion:
        """A process on the kept steps of :func:`spaced_steps` with the same marginals (see module docstring)."""
        kept = spaced_steps(self.num_steps, spec)
        abar = self.alphas_cumprod[kept]
        prev = torch.cat([torch.ones(1, dtype=torch.float64), abar[:-1]])
        return GaussianDiffusion(
            1.0 - abar / prev,
            learn_sigma=self.learn_sigma,
            vlb_weight=self.vlb_weight,
            clip_denoised=self.clip_denoised,
            timestep_map=self.timestep_map[kept].tolist(),
            num_train_steps=self.num_train_steps,
        )

    # ---- helpers --------------------------------------------------------------------------------------------------
    def _device_table(self, name: str, device: torch.device) -> torch.Tensor:
        """Table ``name`` (a float32 schedule table, or ``timestep_map``) on ``device``, copied there once: indexing
        it with device timesteps never waits for the GPU (a ``t.cpu()`` per lookup would sync every training step)."""
        key = (name, device)
        if key not in self._on_device:
            self._on_device[key] = self._tables[name].to(device)
        return self._on_device[key]

    def _at(self, name: str, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Schedule table ``name`` at timesteps t [B], float32 on x's device, shaped [B, 1, ..., 1] to broadcast."""
        return self._device_table(name, x.device)[t.to(x.device)].view(-1, *([1] * (x.ndim - 1)))

    def _model(self, model_fn: ModelFn, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Call the model with its own (original) timesteps and check the output channels."""
        out = model_fn(x, self._device_table("timestep_map", x.device)[t])
        want = 2 * x.shape[1] if self.learn_sigma else x.shape[1]
        if out.shape[1] != want:
            raise ValueError(
                f"model output has {out.shape[1]} channels, expected {want} for input {tuple(x.shape)} "
                f"(learn_sigma={self.learn_sigma})"
            )
        return out

    # ---- forward process ------------------------------------------------------------------------------------------
    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise."""
        return self._at("sqrt_abar", t, x0) * x0 + self._at("sqrt_one_minus_abar", t, x0) * noise

    def q_posterior(self, x0: torch.Tensor, xt: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and clipped log-variance of q(x_{t-1} | x_t, x0)."""
        mean = self._at("post_coef_x0", t, xt) * x0 + self._at("post_coef_xt", t, xt) * xt
        return mean, self._at("post_log_var", t, xt).expand_as(xt)

    # ---- reverse process ------------------------------------------------------------------------------------------
    def p_mean_variance(self, out: torch.Tensor, xt: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        """From the model output [B, 2C | C, H, W]: eps, x0_hat, and the mean / log-variance of p(x_{t-1} | x_t)."""
        c = xt.shape[1]
        eps = out[:, :c]
        if self.learn_sigma:
            frac = (out[:, c:] + 1.0) / 2.0
            log_var = frac * self._at("log_betas", t, xt) + (1.0 - frac) * self._at("post_log_var", t, xt)
        else:
            log_var = self._at("post_log_var", t, xt).expand_as(xt)
        x0 = self._at("rsqrt_abar", t, xt) * xt - self._at("sqrt_recipm1_abar", t, xt) * eps
        if self.clip_denoised:
            x0 = x0.clamp(-1.0, 1.0)
        mean, _ = self.q_posterior(x0, xt, t)
        return {"eps": eps, "x0": x0, "mean": mean, "log_var": log_var}

    def vlb_terms(self, out: torch.Tensor, x0: torch.Tensor, xt: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """L_t in bits per dimension, [B]: KL(q(x_{t-1}|x_t,x0) || p(x_{t-1}|x_t)) for t > 0, the discretised
        decoder NLL -log p(x0 | x1) for t = 0 (x0 must be 8-bit data in [-1, 1] there)."""
        p = self.p_mean_variance(out, xt, t)
        q_mean, q_log_var = self.q_posterior(x0, xt, t)
        kl = normal_kl(q_mean, q_log_var, p["mean"], p["log_var"]).flatten(1).mean(1) / LN2
        nll = -discretized_gaussian_log_likelihood(x0, p["mean"], 0.5 * p["log_var"]).flatten(1).mean(1) / LN2
        return torch.where(t == 0, nll, kl)

    def training_losses(
        self, model_fn: ModelFn, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Per-sample losses [B]: ``mse`` (L_simple), ``vlb`` (L_t, bits/dim, 0 without learned sigma) and
        ``loss`` = mse + lambda T vlb, where the VLB sees the mean through a stop-gradient."""
        xt = self.q_sample(x0, t, noise)
        out = self._model(model_fn, xt, t)
        c = x0.shape[1]
        mse = (noise - out[:, :c]).float().pow(2).flatten(1).mean(1)
        if not self.learn_sigma:
            return {"loss": mse, "mse": mse, "vlb": torch.zeros_like(mse)}
        frozen = torch.cat([out[:, :c].detach(), out[:, c:]], dim=1).float()
        vlb = self.vlb_terms(frozen, x0.float(), xt.float(), t)
        return {"loss": mse + self.vlb_weight * self.num_train_steps * vlb, "mse": mse, "vlb": vlb}

    @torch.no_grad()
    def bits_per_dim(
        self,
        model_fn: ModelFn,
        x0: torch.Tensor,
        noise: SampleNoise,
        num_t_samples: int | None = None,
        buckets: int = 0,
    ) -> dict[str, torch.Tensor]:
        """Variational bound in bits/dim, [B] each: ``bpd`` = ``prior`` KL(q(x_{K-1}|x0) || N(0, I)) + ``terms``
        sum_t L_t. Needs pixel data (8-bit values in [-1, 1]); on a respaced process it is that chain's (looser) bound.

        ``num_t_samples`` None sums every step exactly (K model calls). An int S estimates the same sum without bias
        from L_0 plus one t per stratum: steps 1..K-1 split into S contiguous strata, t uniform within stratum s
        (drawn from each sample's generator), sum_t L_t ~ L_0 + sum_s |stratum s| L_{t_s} (S + 1 model calls).

        ``buckets`` M > 0 adds ``buckets`` [B, M]: the part of ``terms`` from each of M equal ranges of t
        (:func:`t_buckets`; every term goes to the range of its t, so the columns sum to ``terms`` and each is an
        unbiased estimate of its range's sum of L_t).
        """
        b, k = x0.shape[0], self.num_steps
        if num_t_samples is None or num_t_samples >= k - 1:
            steps = [(torch.full((b,), i, dtype=torch.long), 1.0) for i in reversed(range(k))]
        else:
            bounds = [1 + (s * (k - 1)) // num_t_samples for s in range(num_t_samples + 1)]
            steps = [(torch.zeros(b, dtype=torch.long), 1.0)]
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                u = noise.uniform(())
                steps.append((lo + (u * (hi - lo)).long().clamp(max=hi - lo - 1).cpu(), float(hi - lo)))
        split = torch.zeros(b, max(buckets, 1), device=x0.device)
        edges = torch.tensor([lo for lo, _ in t_buckets(k, buckets)][1:], device=x0.device)
        for t, weight in steps:
            t = t.to(x0.device)
            xt = self.q_sample(x0, t, noise(x0.shape[1:]))
            term = weight * self.vlb_terms(self._model(model_fn, xt, t).float(), x0, xt, t)
            split.scatter_add_(1, torch.bucketize(t, edges, right=True)[:, None], term[:, None])
        terms = split.sum(1)
        last = torch.full((b,), k - 1, device=x0.device, dtype=torch.long)
        mean = self._at("sqrt_abar", last, x0) * x0
        log_var = self._at("log_one_minus_abar", last, x0).expand_as(x0)
        prior = normal_kl(mean, log_var, torch.zeros_like(x0), torch.zeros_like(x0)).flatten(1).mean(1) / LN2
        return {"bpd": terms + prior, "prior": prior, "terms": terms, **({"buckets": split} if buckets else {})}

    # ---- samplers -------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(
        self,
        model_fn: ModelFn,
        shape: Sequence[int],
        noise: SampleNoise,
        *,
        method: str = "ddpm",
        eta: float = 0.0,
        progress: bool = False,
    ) -> torch.Tensor:
        """Draw x0 of ``shape`` [B, C, H, W] by ancestral DDPM (``method="ddpm"``) or DDIM with ``eta`` over this
        process's steps (respace first for fewer steps). Returns [B, C, H, W] float32."""
        if method not in SAMPLERS:
            raise ValueError(f"unknown sampler {method!r}: use 'ddpm' or 'ddim'")
        from tqdm.auto import tqdm

        x = noise(shape[1:])
        for i in tqdm(
            list(reversed(range(self.num_steps))), desc=f"{method} sampling", disable=not progress, leave=False
        ):
            t = torch.full((shape[0],), i, device=x.device, dtype=torch.long)
            p = self.p_mean_variance(self._model(model_fn, x, t).float(), x, t)
            if method == "ddpm":
                x = p["mean"] + (torch.exp(0.5 * p["log_var"]) * noise(shape[1:]) if i > 0 else 0.0)
            else:
                abar = self._at("abar", t, x)
                abar_prev = self._at("abar_prev", t, x)
                eps = (self._at("rsqrt_abar", t, x) * x - p["x0"]) / self._at("sqrt_recipm1_abar", t, x)
                sigma = eta * torch.sqrt((1.0 - abar_prev) / (1.0 - abar) * (1.0 - abar / abar_prev))
                x = abar_prev.sqrt() * p["x0"] + torch.sqrt((1.0 - abar_prev - sigma**2).clamp_min(0.0)) * eps
                if i > 0 and eta > 0:
                    x = x + sigma * noise(shape[1:])
        return x

    def scheduler_betas(self) -> list[float]:
        """Betas to build a matching diffusers scheduler: ``DDPMScheduler(trained_betas=d.scheduler_betas(), ...)``."""
        return self.betas.tolist()


@torch.no_grad()
def sample_with_scheduler(
    model_fn: ModelFn, scheduler, shape: Sequence[int], noise: SampleNoise, num_inference_steps: int
) -> torch.Tensor:
    """Sample with a diffusers scheduler (DDPMScheduler, DDIMScheduler, ...) driving the model's eps output.

    The scheduler must use the same betas (``trained_betas=diffusion.scheduler_betas()``) and
    ``prediction_type="epsilon"``. Schedulers with ``variance_type`` "learned" / "learned_range" receive the whole
    [B, 2C, H, W] output (diffusers' learned_range is the same (v + 1) / 2 interpolation); others the eps half.
    Per-sample generators keep results independent of batching. Returns [B, C, H, W].
    """
    c = shape[1]
    learned = getattr(scheduler.config, "variance_type", None) in ("learned", "learned_range")
    scheduler.set_timesteps(num_inference_steps)
    x = noise(shape[1:]) * scheduler.init_noise_sigma
    for step in scheduler.timesteps:
        t = torch.full((shape[0],), int(step), device=x.device, dtype=torch.long)
        out = model_fn(scheduler.scale_model_input(x, step), t).float()
        out = out if learned else out[:, :c]
        x = scheduler.step(out, step, x, generator=noise.generators).prev_sample.to(noise.device)
    return x


__all__ = [
    "GaussianDiffusion",
    "SampleNoise",
    "discretized_gaussian_log_likelihood",
    "guided",
    "linear_betas",
    "normal_kl",
    "sample_with_scheduler",
    "spaced_steps",
]
