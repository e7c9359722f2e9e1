"""Gaussian diffusion against closed forms, respacing, samplers and diffusers schedulers."""

import math

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from lightvision.diffusion.gaussian import (
    GaussianDiffusion,
    SampleNoise,
    discretized_gaussian_log_likelihood,
    guided,
    normal_kl,
    spaced_steps,
    t_buckets,
)


def oracle(diffusion: GaussianDiffusion, x0: torch.Tensor, v: float):
    """A model that knows x0: eps = (x_t - sqrt(abar) x0) / sqrt(1 - abar), constant variance output v."""

    def fn(xt, t_model):
        i = torch.searchsorted(diffusion.timestep_map, t_model)
        abar = diffusion.alphas_cumprod[i].float().view(-1, 1, 1, 1)
        eps = (xt - abar.sqrt() * x0) / (1 - abar).sqrt()
        return torch.cat([eps, torch.full_like(eps, v)], dim=1)

    return fn


def smooth_model(x, t):
    """A fixed nonlinear (eps, v) predictor of x and t, cheap enough for 1000-step samplers."""
    eps = 0.5 * torch.tanh(x) + 1e-4 * t.float().view(-1, 1, 1, 1)
    return torch.cat([eps, torch.tanh(x.mean(dim=(2, 3), keepdim=True)).expand_as(x)], dim=1)


def test_respacing_keeps_marginals_and_maps_timesteps():
    d = GaussianDiffusion.linear(1000)
    r = d.respace("250")
    kept = spaced_steps(1000, 250)
    assert len(kept) == 250 and kept[0] == 0 and kept[-1] == 999
    assert r.num_steps == 250 and r.timestep_map.tolist() == kept
    torch.testing.assert_close(r.alphas_cumprod, d.alphas_cumprod[kept], rtol=1e-12, atol=0)
    rr = r.respace(10)  # respacing a respaced process still maps to the original timesteps
    assert set(rr.timestep_map.tolist()) <= set(kept) and rr.timestep_map[-1] == 999
    with pytest.raises(ValueError, match="respacing"):
        d.respace(0)


def test_normal_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    m1, m2, lv1, lv2 = (torch.randn(100, generator=g, dtype=torch.float64) for _ in range(4))
    ref = torch.distributions.kl_divergence(
        torch.distributions.Normal(m1, (0.5 * lv1).exp()), torch.distributions.Normal(m2, (0.5 * lv2).exp())
    )
    torch.testing.assert_close(normal_kl(m1, lv1, m2, lv2), ref)


def test_discretized_likelihood_is_the_bin_mass_and_normalised():
    levels = torch.arange(256, dtype=torch.float64) / 127.5 - 1.0
    mean, log_scale = torch.tensor(0.1, dtype=torch.float64), torch.tensor(math.log(0.3), dtype=torch.float64)
    logp = discretized_gaussian_log_likelihood(levels, mean, log_scale)
    assert abs(logp.exp().sum().item() - 1.0) < 1e-9  # open edge bins: the 256 bins cover the real line
    normal = torch.distributions.Normal(mean, log_scale.exp())
    x = levels[100]
    ref = normal.cdf(x + 1 / 255) - normal.cdf(x - 1 / 255)
    torch.testing.assert_close(logp[100].exp(), ref)
    torch.testing.assert_close(logp[0].exp(), normal.cdf(levels[0] + 1 / 255))


def test_vlb_terms_closed_form():
    d = GaussianDiffusion.linear(1000)
    g = torch.Generator().manual_seed(1)
    x0 = torch.randint(0, 256, (3, 2, 4, 4), generator=g).float() / 127.5 - 1
    t = torch.tensor([5, 400, 999])
    xt = d.q_sample(x0, t, torch.randn(x0.shape, generator=g))
    # exact mean, variance = posterior variance (v = -1): KL = 0
    kl_zero = d.vlb_terms(oracle(d, x0, -1.0)(xt, t), x0, xt, t)
    assert kl_zero.abs().max() < 1e-4
    # exact mean, variance = beta_t (v = +1): KL = 0.5 (log(beta/btilde) + btilde/beta - 1) per dim, in bits
    kl = d.vlb_terms(oracle(d, x0, 1.0)(xt, t), x0, xt, t)
    beta, btilde = d.betas[t], d.posterior_variance[t]
    ref = 0.5 * (torch.log(beta / btilde) + btilde / beta - 1) / math.log(2)
    torch.testing.assert_close(kl.double(), ref, rtol=1e-3, atol=1e-6)
    # t = 0: decoder NLL of the exact mean with std exp(0.5 log btilde_1): -log2 of the central bin mass
    t0 = torch.zeros(3, dtype=torch.long)
    x1 = d.q_sample(x0, t0, torch.randn(x0.shape, generator=g))
    nll = d.vlb_terms(oracle(d, x0, -1.0)(x1, t0), x0, x1, t0)
    std = math.sqrt(d.posterior_variance[1].item())
    normal = torch.distributions.Normal(0.0, std)
    interior = (normal.cdf(torch.tensor(1 / 255)) - normal.cdf(torch.tensor(-1 / 255))).log() / math.log(2)
    edge = normal.cdf(torch.tensor(1 / 255)).log() / math.log(2)
    is_edge = (x0.abs() > 0.999).flatten(1).float().mean(1)
    torch.testing.assert_close(nll, -(is_edge * edge + (1 - is_edge) * interior), rtol=1e-3, atol=1e-4)


def test_bits_per_dim_of_oracle_is_prior_plus_decoder():
    d = GaussianDiffusion.linear(1000).respace(20)
    x0 = torch.tensor([-1.0, 1.0, 0.0, 2 / 255]).view(1, 1, 2, 2)
    out = d.bits_per_dim(oracle(d, x0, -1.0), x0, SampleNoise([0], "cpu"))
    abar = d.alphas_cumprod[-1]
    prior = 0.5 * (abar * x0.double() ** 2 + (1 - abar) - 1 - torch.log(1 - abar)).mean() / math.log(2)
    torch.testing.assert_close(out["prior"].double(), prior.view(1), rtol=1e-4, atol=1e-7)
    assert 0 < out["terms"].item() < 8 and torch.isclose(out["bpd"], out["prior"] + out["terms"])


def test_hybrid_loss_stops_the_gradient_of_the_mean():
    d = GaussianDiffusion.linear(1000)
    w = torch.zeros(8, 4, 1, 1, requires_grad=True)
    model = lambda x, t: torch.nn.functional.conv2d(x, w)  # noqa: E731  (eps from the first 4 weights, v from the rest)
    x0 = torch.rand(2, 4, 4, 4) * 2 - 1
    losses = d.training_losses(model, x0, torch.tensor([3, 700]), torch.randn(2, 4, 4, 4))
    losses["vlb"].sum().backward()
    assert w.grad[:4].abs().max() == 0 and w.grad[4:].abs().max() > 0
    torch.testing.assert_close(losses["loss"], losses["mse"] + losses["vlb"])  # lambda T = 0.001 * 1000


def test_samples_depend_only_on_their_seed():
    d = GaussianDiffusion.linear(1000).respace(25)
    for method, eta in (("ddpm", 0.0), ("ddim", 0.5)):
        a = d.sample(smooth_model, (3, 2, 4, 4), SampleNoise([1, 2, 3], "cpu"), method=method, eta=eta)
        b = d.sample(smooth_model, (1, 2, 4, 4), SampleNoise([2], "cpu"), method=method, eta=eta)
        c = d.sample(smooth_model, (3, 2, 4, 4), SampleNoise([1, 2, 3], "cpu"), method=method, eta=eta)
        torch.testing.assert_close(a[1:2], b)
        assert torch.equal(a, c) and not torch.allclose(a[0], a[2])


def test_guidance_mixes_only_the_requested_channels():
    def model(x, t, y):
        return torch.cat([x * 0 + y.float().view(-1, 1, 1, 1), x * 0 + 7], dim=1)

    x, t, y = torch.zeros(2, 4, 2, 2), torch.zeros(2, dtype=torch.long), torch.tensor([3, 5])
    out = guided(model, y, null_class=10, scale=2.0, guide_channels=3)(x, t)
    # eps_u = 10, eps_c = y: guided = 10 + 2 (y - 10) on channels 0-2, conditional on channel 3, variance 7
    assert out[0, :3].eq(-4).all() and out[0, 3].eq(3).all() and out[1, :3].eq(0).all() and out[:, 4:].eq(7).all()
    assert guided(model, y, 10, 2.0, guide_channels=None)(x, t)[0, :4].eq(-4).all()


def test_diffusers_schedulers_drive_the_model_output():
    d = GaussianDiffusion.linear(1000)
    shape, seeds = (2, 2, 3, 3), [11, 12]
    ours = d.sample(smooth_model, shape, SampleNoise(seeds, "cpu"), method="ddim", eta=0.0)
    ddim = DDIMScheduler(trained_betas=d.scheduler_betas(), clip_sample=False, set_alpha_to_one=True)
    from lightvision.diffusion.gaussian import sample_with_scheduler

    theirs = sample_with_scheduler(smooth_model, ddim, shape, SampleNoise(seeds, "cpu"), 1000)
    torch.testing.assert_close(theirs, ours, rtol=1e-3, atol=1e-3)
    ours = d.sample(smooth_model, shape, SampleNoise(seeds, "cpu"), method="ddpm")
    ddpm = DDPMScheduler(trained_betas=d.scheduler_betas(), clip_sample=False, variance_type="learned_range")
    theirs = sample_with_scheduler(smooth_model, ddpm, shape, SampleNoise(seeds, "cpu"), 1000)
    torch.testing.assert_close(theirs, ours, rtol=1e-3, atol=1e-3)


def test_stratified_bits_per_dim_is_an_unbiased_estimate_of_the_full_bound():
    d = GaussianDiffusion.linear(1000).respace(40)
    x0 = torch.randint(0, 256, (64, 1, 2, 2), generator=torch.Generator().manual_seed(3)).float() / 127.5 - 1

    def model(x, t):  # a fixed imperfect denoiser: eps shrunk by 10%, a t-dependent variance choice
        eps = 0.9 * smooth_model(x, t)[:, :1]
        return torch.cat([eps, torch.tanh(t.float() / 500 - 1).view(-1, 1, 1, 1).expand_as(x)], dim=1)

    exact = d.bits_per_dim(model, x0, SampleNoise(range(64), "cpu"))["bpd"].mean()
    estimate = d.bits_per_dim(model, x0, SampleNoise(range(100, 164), "cpu"), num_t_samples=8)["bpd"].mean()
    assert exact > 0 and abs(estimate - exact) < 0.05 * exact


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host-sync check needs a CUDA device")
def test_training_loss_and_sampling_do_not_sync_with_the_host():
    """Schedule lookups stay on the device: after a first call (which copies each table to the GPU once) the hybrid
    loss and DDPM / DDIM sampling never wait for the GPU (``set_sync_debug_mode("error")`` raises on a sync)."""
    d = GaussianDiffusion.linear(1000, clip_denoised=True)
    r = d.respace(2)
    x0 = torch.rand(4, 3, 8, 8, device="cuda") * 2 - 1
    t = torch.randint(0, 1000, (4,), device="cuda")

    def run():
        losses = d.training_losses(smooth_model, x0, t, torch.randn_like(x0))
        for method in ("ddpm", "ddim"):
            r.sample(smooth_model, x0.shape, SampleNoise([0, 1, 2, 3], "cuda"), method=method)
        return losses

    run()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        losses = run()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(losses["loss"]).all()


def test_bits_per_dim_split_by_t_bucket_sums_to_the_bound():
    """Each bucket holds its range's terms: the columns sum to ``terms``, the exact split matches the stratified one
    on average, and ``bpd`` is unchanged by asking for the split."""
    d = GaussianDiffusion.linear(1000).respace(40)
    x0 = torch.randint(0, 256, (64, 1, 2, 2), generator=torch.Generator().manual_seed(3)).float() / 127.5 - 1

    def model(x, t):
        eps = 0.9 * smooth_model(x, t)[:, :1]
        return torch.cat([eps, torch.tanh(t.float() / 500 - 1).view(-1, 1, 1, 1).expand_as(x)], dim=1)

    assert t_buckets(40, 4) == [(0, 10), (10, 20), (20, 30), (30, 40)] and t_buckets(40, 0) == [(0, 40)]
    with pytest.raises(ValueError, match="at most 40"):
        t_buckets(40, 41)
    plain = d.bits_per_dim(model, x0, SampleNoise(range(64), "cpu"))
    exact = d.bits_per_dim(model, x0, SampleNoise(range(64), "cpu"), buckets=4)
    assert exact["buckets"].shape == (64, 4) and "buckets" not in plain
    torch.testing.assert_close(exact["buckets"].sum(1), exact["terms"])
    torch.testing.assert_close(exact["bpd"], plain["bpd"])
    assert (exact["buckets"] > 0).all()
    estimate = d.bits_per_dim(model, x0, SampleNoise(range(100, 164), "cpu"), num_t_samples=8, buckets=4)
    torch.testing.assert_close(estimate["buckets"].sum(1), estimate["terms"])
    for j in range(4):
        e, x = estimate["buckets"][:, j].mean(), exact["buckets"][:, j].mean()
        assert abs(e - x) < 0.1 * exact["terms"].mean(), (j, e, x)
