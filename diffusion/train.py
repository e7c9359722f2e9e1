"""``lightvision diffusion train``: a DiT on latents or pixels through the engine Trainer.

Recipe = :data:`DEFAULTS` <- the recipe's ``base`` chain (YAML files, each may name its own ``base``) <- the recipe
<- ``key=value`` overrides. Each step draws t ~ U{0..T-1}, eps ~ N(0, I) per sample and minimises the hybrid loss of
:class:`~lightvision.diffusion.gaussian.GaussianDiffusion` (``loss`` = mse + lambda T vlb; all three are logged).
A hook writes an EMA sample grid (PNG) every ``sample.every`` steps; the Trainer provides accelerate / bf16, EMA,
clipping, atomic checkpoints, exact ``--resume``, NaN stop and the JSON-lines log. ``data.batch_size`` is the global
batch (split over processes and accumulation steps), and the loss draws go through the engine's ``batch_random()``,
so ``accelerate launch`` on W GPUs trains the same run as one GPU, up to floating-point noise.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import yaml
from torch.utils.data import DataLoader

from lightvision.diffusion.autoencoder import DEFAULT_VAE, Codec, load_codec
from lightvision.diffusion.dit import DiT, create_model
from lightvision.diffusion.gaussian import GaussianDiffusion
from lightvision.diffusion.latents import build_dataset, draw_latents
from lightvision.engine.batch_random import batch_random
from lightvision.engine.data import loader_workers

DEFAULTS: dict = {
    "base": None,
    "run_dir": "runs/diffusion",
    "seed": 0,
    "model": {"name": "softmax_dit_xl_2", "kwargs": {}},
    "data": {"source": "latents", "root": None, "image_size": 256, "channels": 3, "num_classes": 1000,
             "train_split": "train", "test_split": "val", "batch_size": 256, "num_workers": 4,
             "flip": True},  # flip: random horizontal flips of pixel-space training images (false: deterministic)
    "autoencoder": {"kind": "kl", "path": DEFAULT_VAE},
    "diffusion": {"steps": 1000, "learn_sigma": True, "vlb_weight": 0.001, "clip_denoised": False},
    "optim": {"lr": 1e-4, "weight_decay": 0.0, "betas": [0.9, 0.999], "warmup_steps": 0},
    "train": {"max_steps": 400_000, "grad_accum_steps": 1, "clip_grad": None, "ema_decay": 0.9999,
              "mixed_precision": "bf16", "log_every": 100, "ckpt_every": 50_000, "keep_last": 3, "nan_policy": "stop",
              "compile": False},  # compile: torch.compile the DiT (lightvision kernels stay in the graph as custom ops)
    "sample": {"every": 50_000, "num": 16, "sampler": "ddpm", "steps": 250, "eta": 0.0, "cfg_scale": 4.0,
               "guide_channels": 3, "seed": 0},
}


def load_recipe(path: str | Path | None, overrides: list[str] = ()) -> dict:
    """Resolve a recipe: defaults <- base chain <- file <- overrides (engine ``load_config``, unknown keys refused)."""
    from lightvision.engine.config import load_config

    if path is None:
        return load_config(None, overrides, defaults=DEFAULTS)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe {str(path)!r} not found")
    base = (yaml.safe_load(path.read_text()) or {}).get("base")
    defaults = load_recipe(path.parent / base) if base else DEFAULTS
    cfg = load_config(path, overrides, defaults=defaults)
    cfg["base"] = None
    return cfg


def build_codec(cfg: dict, device: str | torch.device = "cpu") -> Codec:
    """The recipe's autoencoder (pixel space: ``data.channels`` channels)."""
    ae = cfg["autoencoder"]
    return load_codec(ae["kind"], ae.get("path"), channels=int(cfg["data"]["channels"]), device=device)


def model_config_for(cfg: dict, codec_channels: int, latent_size: int) -> dict:
    """What rebuilds the network: registry name, latent geometry, classes and constructor overrides."""
    return {"name": cfg["model"]["name"], "input_size": latent_size, "in_channels": codec_channels,
            "num_classes": int(cfg["data"]["num_classes"]), "learn_sigma": bool(cfg["diffusion"]["learn_sigma"]),
            **copy.deepcopy(cfg["model"]["kwargs"])}


def build_model(model_config: dict) -> DiT:
    """A DiT from :func:`model_config_for`'s dict (as stored in checkpoints)."""
    kwargs = dict(model_config)
    return create_model(kwargs.pop("name"), **kwargs)


def build_diffusion(cfg: dict) -> GaussianDiffusion:
    """The training diffusion of a recipe (linear schedule, ``diffusion.steps`` steps)."""
    d = cfg["diffusion"]
    return GaussianDiffusion.linear(int(d["steps"]), learn_sigma=bool(d["learn_sigma"]), vlb_weight=float(d["vlb_weight"]),
                                    clip_denoised=bool(d["clip_denoised"]))


@torch.no_grad()
def evaluate_bits_per_dim(model: torch.nn.Module, cfg: dict, dataset, device: torch.device | str, *, batch_size: int = 500,
                          num_t_samples: int | None = 50, num_workers: int = 0) -> float:
    """Mean VLB (bits/dim) of a pixel-space ``dataset`` under the recipe's full training diffusion; noise and t are
    seeded per image (image i: seed i), ``num_t_samples`` stratified timesteps per image (None: all T steps)."""
    from lightvision.diffusion.gaussian import SampleNoise

    diffusion = build_diffusion(cfg)
    total, count = 0.0, 0
    for x, y in DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers):
        x, y = x.to(device), y.to(device)
        noise = SampleNoise(range(count, count + len(y)), device)
        bpd = diffusion.bits_per_dim(lambda xt, t: model(xt, t, y), x, noise, num_t_samples)["bpd"]
        total, count = total + bpd.sum().item(), count + len(y)
    return total / count


def make_loss_fn(diffusion: GaussianDiffusion, scaling_factor: float | None = None):
    """``loss_fn(model, (x, y [B]))`` -> {"loss", "mse", "vlb"} batch means; t and eps drawn here. x is pixels
    [B, C, H, W], or latent moments [B, 2, 2, c, h, w] when ``scaling_factor`` is given (z drawn by draw_latents).
    All draws go through the engine's ``batch_random()``, so under the Trainer a sample's t, eps (and z) depend on
    its position in the global batch, not on the number of processes."""

    def loss_fn(model: torch.nn.Module, batch) -> dict[str, torch.Tensor]:
        x, y = batch
        if scaling_factor is not None:
            x = draw_latents(x, scaling_factor)
        draws = batch_random()
        t = draws.randint(0, diffusion.num_steps, (x.shape[0],), device=x.device)
        losses = diffusion.training_losses(lambda xt, tt: model(xt, tt, y), x, t, draws.randn_like(x))
        return {k: v.mean() for k, v in losses.items()}

    return loss_fn


def sample_hook(cfg: dict, diffusion: GaussianDiffusion, codec_fn, out_dir: Path):
    """Trainer hook: an EMA (or raw) sample grid ``samples/step_XXXXXXX.png`` on the main process (sample i has
    label i % num_classes and seed ``sample.seed`` + i; one column per class)."""
    from lightvision.diffusion.sample import generate, save_grid

    s = cfg["sample"]
    respaced = diffusion.respace(s["steps"])

    def hook(trainer) -> dict:
        if not trainer.accelerator.is_main_process:
            return {}
        model = trainer.ema.module if trainer.ema is not None else trainer.unwrapped_model
        was_training = model.training
        model.eval()
        n = int(s["num"])
        num_classes = model.config.num_classes
        labels = [i % num_classes for i in range(n)] if num_classes else None
        images = generate(model, respaced, codec_fn(), labels, list(range(s["seed"], s["seed"] + n)),
                          latent_size=model.config.input_size, sampler=s["sampler"], eta=s["eta"],
                          cfg_scale=s["cfg_scale"] if num_classes else 1.0, guide_channels=s["guide_channels"],
                          device=trainer.accelerator.device)
        model.train(was_training)
        path = out_dir / "samples" / f"step_{trainer.step:07d}.png"
        save_grid(images, path, nrow=min(num_classes, n) if num_classes else None)
        return {"sample_grid": str(path)}

    return hook


def train(cfg: dict, resume: bool | str | None = None, extra_hooks: list = ()) -> dict:
    """Train a recipe; returns the Trainer summary (also written to ``run_dir/results.json``, with the number of
    processes and the global / per-process batch) plus the run folder. ``data.batch_size`` is the global batch."""
    from accelerate import PartialState

    from lightvision.engine.trainer import Trainer

    state = PartialState(cpu=not torch.cuda.is_available())  # cpu: several CPU processes join one gloo group
    torch.manual_seed(int(cfg["seed"]))
    run_dir = Path(cfg["run_dir"])
    data = cfg["data"]
    dataset = build_dataset(data, "train")
    scaling_factor = None
    if data["source"] == "latents":
        meta = dataset.meta
        channels, latent_size = meta["latent_shape"][0], meta["latent_shape"][1]
        scaling_factor = dataset.scaling_factor
    else:
        channels, latent_size = int(data["channels"]), int(data["image_size"])
        if cfg["autoencoder"]["kind"] != "pixel":
            raise ValueError(f"data.source {data['source']!r} trains in pixel space: set autoencoder.kind=pixel "
                             "(or extract latents first for latent diffusion)")
    model_config = model_config_for(cfg, channels, latent_size)
    model = build_model(model_config)
    diffusion = build_diffusion(cfg)
    t = cfg["train"]
    per_process = int(data["batch_size"]) // (state.num_processes * int(t["grad_accum_steps"]))
    if per_process < 1 or per_process * state.num_processes * int(t["grad_accum_steps"]) != int(data["batch_size"]):
        raise ValueError(f"data.batch_size {data['batch_size']} is not divisible by processes x grad_accum_steps "
                         f"({state.num_processes} x {t['grad_accum_steps']})")
    workers = loader_workers(int(data["num_workers"]))
    loader = DataLoader(dataset, batch_size=per_process, shuffle=True, drop_last=True, num_workers=workers,
                        pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0)
    o = cfg["optim"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(o["lr"]), betas=tuple(o["betas"]), weight_decay=float(o["weight_decay"]))
    warmup = int(o["warmup_steps"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup)) if warmup > 0 else None
    codec_cache: list[Codec] = []

    def codec_fn() -> Codec:
        if not codec_cache:
            codec_cache.append(build_codec(cfg, state.device))
        return codec_cache[0]

    hooks = [(int(cfg["sample"]["every"]), sample_hook(cfg, diffusion, codec_fn, run_dir)), *extra_hooks]
    precision = "no" if t["mixed_precision"] in (False, None) else str(t["mixed_precision"])  # YAML 1.1 reads no as false
    trainer = Trainer(run_dir, cfg, model, optimizer, scheduler, loader, make_loss_fn(diffusion, scaling_factor),
                      max_steps=int(t["max_steps"]), model_config=model_config, grad_accum_steps=int(t["grad_accum_steps"]),
                      clip_grad=t["clip_grad"], ema_decay=t["ema_decay"], mixed_precision=precision,
                      log_every=int(t["log_every"]), ckpt_every=int(t["ckpt_every"]), keep_last=int(t["keep_last"]),
                      nan_policy=t["nan_policy"], seed=int(cfg["seed"]), hooks=hooks, torch_compile=bool(t["compile"]))
    summary = trainer.fit(resume)
    summary.update(processes=state.num_processes, global_batch=int(data["batch_size"]), per_process_batch=per_process)
    if hasattr(dataset, "skipped_images"):  # image folders: unreadable images skipped (this process's count)
        summary["skipped_images"] = dataset.skipped_images()
    if state.is_main_process:
        from lightvision.engine.config import save_config

        save_config(summary, run_dir / "results.json")
    return {**summary, "run_dir": str(run_dir), "trainer": trainer}
