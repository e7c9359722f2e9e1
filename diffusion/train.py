"""``lightvision diffusion train``: a DiT on latents or pixels through the engine Trainer.

Recipe = :data:`DEFAULTS` <- the recipe's ``base`` chain (YAML files, each may name its own ``base``) <- the recipe
<- ``key=value`` overrides, in the schema both families share (docs/design.md "Recipe schema"). Each step draws
t ~ U{0..T-1}, eps ~ N(0, I) per sample and minimises the hybrid loss of
:class:`~lightvision.diffusion.gaussian.GaussianDiffusion` (``loss`` = mse + lambda T vlb; all three are logged).
A hook writes an EMA sample grid (PNG) every ``sample.every`` steps, another scores ``train.eval_samples`` EMA samples
(FID, sFID, precision / recall; :func:`eval_hook`) every ``train.eval_every_steps`` steps; the Trainer provides
accelerate / bf16, EMA, clipping, atomic checkpoints, exact ``--resume``, NaN stop and the JSON-lines log.
``train.batch_size`` is the batch of one process and accumulation step (global batch = that x processes x
``train.grad_accum_steps``), and the loss draws go through the engine's ``batch_random()``, so ``accelerate launch``
on W GPUs with 1/W of the batch trains the same run as one GPU, up to floating-point noise.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from lightvision.diffusion.autoencoder import DEFAULT_VAE, KINDS, Codec, load_codec
from lightvision.diffusion.dit import DiT, create_model
from lightvision.diffusion.fid import PRC_NEIGHBOURHOOD
from lightvision.diffusion.gaussian import SAMPLERS, GaussianDiffusion, SampleNoise, t_buckets
from lightvision.diffusion.latents import build_dataset, draw_latents
from lightvision.engine.batch_random import batch_random
from lightvision.engine.compiled import compile_setting
from lightvision.engine.config import check_betas, check_number
from lightvision.engine.data import loader_workers
from lightvision.engine.fused_update import check_fused, fused_kwargs
from lightvision.engine.guards import NAN_POLICIES
from lightvision.engine.sample_draws import KeyedDraws, KeyedSampler
from lightvision.ops._checks import check_choice

DEFAULTS: dict = {
    # args: DiT constructor overrides as one mapping (an open section: model.args.depth=2; the attention's options are
    # model.args.attn_kwargs, the constructor's attention_kwargs); init_from: start from a checkpoint (a run folder,
    # the official DiT or a diffusers DiT; its EMA when it has one): every tensor of the same name and shape is
    # copied, e.g. a softmax DiT into a LION or LightNet DiT
    "model": {"name": "softmax_dit_xl_2", "args": {}, "init_from": None},
    "data": {
        "source": "latents",
        "root": None,
        "image_size": 256,
        "channels": 3,
        "num_classes": 1000,
        "train_split": "train",
        "val_split": "val",
        "num_workers": 4,
        "flip": True,
    },  # flip: random horizontal flips of pixel-space training images (false: deterministic)
    "autoencoder": {"kind": "kl", "path": DEFAULT_VAE},
    "diffusion": {"steps": 1000, "learn_sigma": True, "vlb_weight": 0.001, "clip_denoised": False},
    "optim": {
        "lr": 1e-4,
        "weight_decay": 0.0,
        "betas": [0.9, 0.999],
        "clip_grad": None,
        "fused": None,  # AdamW's update as one fused program (less host time a step); null: on CUDA
    },
    "sched": {"warmup_steps": 0},  # linear warm-up to optim.lr, then constant
    "train": {
        "seed": 0,
        "batch_size": 256,  # per process and micro-batch
        "max_steps": 400_000,
        "grad_accum_steps": 1,
        "ema_decay": 0.9999,
        "mixed_precision": "bf16",
        "log_every": 100,
        "ckpt_every_steps": 50_000,
        "keep_last": 3,
        "nan_policy": "stop",
        "compile": False,  # compile: torch.compile the DiT (lightvision kernels stay in the graph as custom ops)
        "compile_mode": None,  # with compile: "reduce-overhead" (CUDA graphs), "max-autotune", ... (null: default)
        "profile_steps": None,  # [first, count]: profile those optimizer steps into RUN/profile (trace, summary)
        "profile_host": True,  # false (CUDA): that profile records the device alone (its idle time the run's own)
        "graph_update": True,  # CUDA, fused Adam/AdamW: the update after the backward replayed as one CUDA graph
        "eval_every_steps": 0,
        "eval_samples": 5000,
    },  # FID etc. of eval_samples EMA samples every eval_every_steps
    "sample": {
        "every": 50_000,
        "num": 16,
        "sampler": "ddpm",
        "steps": 250,
        "eta": 0.0,
        "cfg_scale": 4.0,
        "guide_channels": 3,
        "seed": 0,
    },
    # evaluation during training (train.eval_every_steps > 0): sample i has label i % num_classes and seed ``seed + i``;
    # reference = image folder, .npz batch or `lightvision diffusion fid-ref` statistics; the feature network is
    # chosen as by `lightvision diffusion fid` (feature_extractor, inception_weights, else the 32 px yardstick);
    # bpd_images > 0 (pixel space): also test bits/dim of that many test images (an even stride over data.val_split),
    # bpd_t_samples stratified timesteps each (null: all), split into bpd_buckets equal ranges of t (0: no split)
    "eval": {
        "reference": None,
        "feature_extractor": None,
        "inception_weights": None,
        "cache_dir": None,
        "sampler": "ddim",
        "steps": 50,
        "eta": 0.0,
        "cfg_scale": 1.0,
        "guide_channels": 3,
        "seed": 0,
        "batch_size": 64,
        "bpd_images": 0,
        "bpd_t_samples": 50,
        "bpd_buckets": 0,
    },
    "run": {"dir": "runs/diffusion"},
}


def load_recipe(path: str | Path | None, overrides: list[str] = ()) -> dict:
    """Resolve a recipe: defaults <- base chain <- file <- overrides (engine ``load_config``, unknown keys refused)."""
    from lightvision.engine.config import load_config

    return load_config(path, overrides, defaults=DEFAULTS)


def check_recipe(cfg: dict) -> None:
    """Every choice and count of a resolved recipe, named by its key, before anything is built or trained (a sampler
    typo would otherwise surface at the first sample grid)."""
    d, t, o, s, e = cfg["data"], cfg["train"], cfg["optim"], cfg["sample"], cfg["eval"]
    check_choice(cfg["autoencoder"]["kind"], KINDS, "autoencoder.kind")
    check_choice(t["mixed_precision"] or "no", ("no", "bf16", "fp16"), "train.mixed_precision")
    check_choice(t["nan_policy"], NAN_POLICIES, "train.nan_policy")
    check_choice(s["sampler"], SAMPLERS, "sample.sampler")
    check_choice(e["sampler"], SAMPLERS, "eval.sampler")
    check_number(t["seed"], "train.seed", 0, integer=True)
    check_number(cfg["diffusion"]["steps"], "diffusion.steps", 1, integer=True)
    check_number(cfg["diffusion"]["vlb_weight"], "diffusion.vlb_weight", 0)
    for key in ("image_size", "channels"):
        check_number(d[key], f"data.{key}", 1, integer=True)
    for key in ("num_classes", "num_workers"):
        check_number(d[key], f"data.{key}", 0, integer=True)
    check_number(o["lr"], "optim.lr", 0, above=True)
    check_number(o["weight_decay"], "optim.weight_decay", 0)
    check_betas(o["betas"])
    check_number(o["clip_grad"], "optim.clip_grad", 0, above=True, optional=True)
    check_fused(o["fused"], torch.optim.AdamW, "adamw")
    check_number(cfg["sched"]["warmup_steps"], "sched.warmup_steps", 0, integer=True)
    for key in ("batch_size", "max_steps", "grad_accum_steps", "log_every", "ckpt_every_steps", "keep_last"):
        check_number(t[key], f"train.{key}", 1, integer=True)
    check_number(t["eval_samples"], "train.eval_samples", 1, integer=True)
    check_number(t["eval_every_steps"], "train.eval_every_steps", 0, integer=True)
    check_number(t["ema_decay"], "train.ema_decay", 0, optional=True)
    for section, block in (("sample", s), ("eval", e)):
        check_number(block["steps"], f"{section}.steps", 1, integer=True)
        if block["steps"] > cfg["diffusion"]["steps"]:
            raise ValueError(
                f"{section}.steps={block['steps']} is more than the diffusion.steps={cfg['diffusion']['steps']} "
                f"of training: sample with at most {cfg['diffusion']['steps']} steps"
            )
        check_number(block["eta"], f"{section}.eta", 0)
        check_number(block["cfg_scale"], f"{section}.cfg_scale", 0)
        check_number(block["guide_channels"], f"{section}.guide_channels", 1, integer=True, optional=True)
    for key in ("every", "num"):
        check_number(s[key], f"sample.{key}", 1, integer=True)
    check_number(e["batch_size"], "eval.batch_size", 1, integer=True)
    check_number(e["bpd_images"], "eval.bpd_images", 0, integer=True)
    check_number(e["bpd_t_samples"], "eval.bpd_t_samples", 1, integer=True, optional=True)
    check_number(e["bpd_buckets"], "eval.bpd_buckets", 0, integer=True)
    if e["bpd_buckets"] > cfg["diffusion"]["steps"]:
        raise ValueError(
            f"eval.bpd_buckets={e['bpd_buckets']} is more than the diffusion.steps={cfg['diffusion']['steps']}: "
            f"split t into at most {cfg['diffusion']['steps']} ranges"
        )
    if e["bpd_images"] and cfg["autoencoder"]["kind"] != "pixel":
        raise ValueError("eval.bpd_images needs pixel-space training (autoencoder.kind=pixel): set eval.bpd_images=0")


def check_num_classes(cfg: dict, dataset) -> None:
    """A class-conditional model (``data.num_classes`` > 0) needs a label embedding row for every class of the data."""
    wanted, found = int(cfg["data"]["num_classes"]), len(dataset.classes)
    if 0 < wanted < found:
        raise ValueError(
            f"data.num_classes={wanted} is smaller than the {found} classes of the training data: "
            f"set data.num_classes={found} (or 0 for an unconditional model)"
        )


def build_codec(cfg: dict, device: str | torch.device = "cpu") -> Codec:
    """The recipe's autoencoder (pixel space: ``data.channels`` channels)."""
    ae = cfg["autoencoder"]
    return load_codec(ae["kind"], ae.get("path"), channels=int(cfg["data"]["channels"]), device=device)


def model_config(cfg: dict, codec_channels: int, latent_size: int) -> dict:
    """What rebuilds the network: registry name, latent geometry, classes and constructor overrides (``model.args``;
    its ``attn_kwargs`` is the constructor's ``attention_kwargs``, the name checkpoints record)."""
    args = copy.deepcopy(cfg["model"]["args"])
    if "attn_kwargs" in args:
        args["attention_kwargs"] = args.pop("attn_kwargs")
    return {
        "name": cfg["model"]["name"],
        "input_size": latent_size,
        "in_channels": codec_channels,
        "num_classes": int(cfg["data"]["num_classes"]),
        "learn_sigma": bool(cfg["diffusion"]["learn_sigma"]),
        **args,
    }


def build_model(config: dict) -> DiT:
    """A DiT from :func:`model_config`'s dict (as stored in checkpoints)."""
    kwargs = dict(config)
    return create_model(kwargs.pop("name"), **kwargs)


def build_diffusion(cfg: dict) -> GaussianDiffusion:
    """The training diffusion of a recipe (linear schedule, ``diffusion.steps`` steps)."""
    d = cfg["diffusion"]
    return GaussianDiffusion.linear(
        int(d["steps"]),
        learn_sigma=bool(d["learn_sigma"]),
        vlb_weight=float(d["vlb_weight"]),
        clip_denoised=bool(d["clip_denoised"]),
    )


def even_indices(length: int, count: int) -> list[int]:
    """``count`` (at most ``length``) indices spread evenly over ``range(length)``: a fixed subset that takes every
    class alike from a class-sorted folder."""
    count = min(count, length)
    return [(i * length) // count for i in range(count)]


@torch.no_grad()
def bits_per_dim_rows(
    model: torch.nn.Module,
    diffusion: GaussianDiffusion,
    dataset,
    indices: list[int],
    device: torch.device | str,
    *,
    batch_size: int = 500,
    num_t_samples: int | None = 50,
    buckets: int = 0,
    num_workers: int = 0,
) -> np.ndarray:
    """[len(indices), 2 + buckets] float64: per image of ``dataset[indices]`` its VLB in bits/dim, the prior term,
    then the terms of each of ``buckets`` ranges of t (:meth:`GaussianDiffusion.bits_per_dim`); the noise and t of
    image i are seeded with i, so a row does not depend on which process or batch computed it."""
    subset = torch.utils.data.Subset(dataset, indices)
    rows, done = [], 0
    for x, y in DataLoader(subset, batch_size=batch_size, shuffle=False, num_workers=num_workers):
        x, y = x.to(device), y.to(device)
        noise = SampleNoise(indices[done : done + len(y)], device)
        out = diffusion.bits_per_dim(lambda xt, t: model(xt, t, y), x, noise, num_t_samples, buckets)
        parts = [out["bpd"][:, None], out["prior"][:, None], *([out["buckets"]] if buckets else [])]
        rows.append(torch.cat(parts, 1).double().cpu().numpy())
        done += len(y)
    return np.concatenate(rows) if rows else np.zeros((0, 2 + buckets))


def bits_per_dim_summary(rows: np.ndarray, num_steps: int, buckets: int = 0) -> dict:
    """The test-set means of :func:`bits_per_dim_rows`: {"test_bits_per_dim", "test_prior_bits_per_dim",
    "bpd_images"} and with ``buckets`` "test_bits_per_dim_t": [{"t": [lo, hi], "bits_per_dim": part}] (the parts
    and the prior sum to the total)."""
    mean = rows.mean(0)
    out = {"test_bits_per_dim": float(mean[0]), "test_prior_bits_per_dim": float(mean[1]), "bpd_images": len(rows)}
    if buckets:
        ranges = t_buckets(num_steps, buckets)
        out["test_bits_per_dim_t"] = [{"t": list(r), "bits_per_dim": float(v)} for r, v in zip(ranges, mean[2:])]
    return out


def evaluate_bits_per_dim(
    model: torch.nn.Module,
    cfg: dict,
    dataset,
    device: torch.device | str,
    *,
    images: int | None = None,
    batch_size: int = 500,
    num_t_samples: int | None = 50,
    buckets: int = 0,
    num_workers: int = 0,
) -> dict:
    """Mean VLB (bits/dim) of a pixel-space ``dataset`` (``images``: that many, :func:`even_indices`; None: all)
    under the recipe's full training diffusion (:func:`bits_per_dim_summary`); ``num_t_samples`` stratified
    timesteps per image (None: all T steps)."""
    rows = bits_per_dim_rows(
        model,
        build_diffusion(cfg),
        dataset,
        even_indices(len(dataset), len(dataset) if images is None else images),
        device,
        batch_size=batch_size,
        num_t_samples=num_t_samples,
        buckets=buckets,
        num_workers=num_workers,
    )
    return bits_per_dim_summary(rows, int(cfg["diffusion"]["steps"]), buckets)


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


def _ema_or_model(trainer) -> torch.nn.Module:
    return trainer.ema.module if trainer.ema is not None else trainer.unwrapped_model


def sample_hook(cfg: dict, diffusion: GaussianDiffusion, codec_fn, out_dir: Path):
    """Trainer hook: an EMA (or raw) sample grid ``samples/step_XXXXXXX.png`` on the main process (sample i has
    label i % num_classes and seed ``sample.seed`` + i; one column per class)."""
    from lightvision.diffusion.sample import generate, save_grid

    s = cfg["sample"]
    respaced = diffusion.respace(s["steps"])

    def hook(trainer) -> dict:
        if not trainer.accelerator.is_main_process:
            return {}
        model = _ema_or_model(trainer)
        was_training = model.training
        model.eval()
        n = int(s["num"])
        num_classes = model.config.num_classes
        labels = [i % num_classes for i in range(n)] if num_classes else None
        images = generate(
            model,
            respaced,
            codec_fn(),
            labels,
            list(range(s["seed"], s["seed"] + n)),
            latent_size=model.config.input_size,
            sampler=s["sampler"],
            eta=s["eta"],
            cfg_scale=s["cfg_scale"] if num_classes else 1.0,
            guide_channels=s["guide_channels"],
            device=trainer.accelerator.device,
        )
        model.train(was_training)
        path = out_dir / "samples" / f"step_{trainer.step:07d}.png"
        save_grid(images, path, nrow=min(num_classes, n) if num_classes else None)
        return {"sample_grid": str(path)}

    return hook


@torch.no_grad()
def sample_features(
    model: DiT,
    diffusion: GaussianDiffusion,
    codec: Codec,
    indices: list[int],
    e: dict,
    net_fn,
    device: torch.device | str,
) -> dict[str, np.ndarray]:
    """Features of samples ``indices`` (label i % num_classes, seed ``e["seed"]`` + i) through ``net_fn(images)``
    (``net_fn`` gets uint8 [B, 3, H, W] and returns {name: [B, D]}); {name: [len(indices), D]} in index order."""
    from lightvision.diffusion.sample import generate, to_uint8

    num_classes = model.config.num_classes
    parts: dict[str, list[np.ndarray]] = {}
    for lo in range(0, len(indices), int(e["batch_size"])):
        idx = indices[lo : lo + int(e["batch_size"])]
        images = generate(
            model,
            diffusion,
            codec,
            [i % num_classes for i in idx] if num_classes else None,
            [int(e["seed"]) + i for i in idx],
            latent_size=model.config.input_size,
            sampler=e["sampler"],
            eta=e["eta"],
            cfg_scale=e["cfg_scale"] if num_classes else 1.0,
            guide_channels=e["guide_channels"],
            device=device,
        )
        for name, value in net_fn(torch.from_numpy(to_uint8(images)).permute(0, 3, 1, 2)).items():
            parts.setdefault(name, []).append(value.numpy())
    return {name: np.concatenate(p) for name, p in parts.items()}


def merge_by_index(parts: list[tuple[list[int], dict[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    """Join the (indices, features) of every process into one set ordered by sample index; an index seen twice
    is an error (each sample must count once)."""
    indices = np.concatenate([np.asarray(idx, dtype=np.int64) for idx, _ in parts])
    if len(np.unique(indices)) != len(indices):
        raise ValueError("a sample index was evaluated on two processes")
    order = np.argsort(indices, kind="stable")
    names = list(parts[0][1]) if parts else []
    return {name: np.concatenate([f[name] for idx, f in parts if len(idx)])[order] for name in names}


def eval_hook(cfg: dict, diffusion: GaussianDiffusion, codec_fn, out_dir: Path):
    """Trainer hook: FID, sFID, precision / recall (+ IS, KID where the network and reference allow) of
    ``train.eval_samples`` samples of the EMA (or raw) weights, and with ``eval.bpd_images`` test bits/dim
    (``test_bits_per_dim``, ``test_prior_bits_per_dim`` and with ``eval.bpd_buckets`` ``test_bits_per_dim_t``:
    :func:`bits_per_dim_summary`). Every process samples and scores its share
    (:func:`~lightvision.diffusion.sample.rank_indices`), results are gathered to the main process, which
    scores the features against the cached reference statistics and redraws ``fid.png`` (FID vs steps, from the
    metrics log, so the curve continues across resumes)."""
    from accelerate.utils import gather_object

    from lightvision.diffusion.features import feature_network
    from lightvision.diffusion.fid import metrics, plot_metric, reference_statistics
    from lightvision.diffusion.sample import rank_indices

    e, n = cfg["eval"], int(cfg["train"]["eval_samples"])
    respaced = diffusion.respace(e["steps"])
    nets: dict = {}

    def test_bits_per_dim_rows(model: torch.nn.Module, rank: int, world: int) -> np.ndarray:
        """This process's share of the fixed test subset (eval.bpd_images images, :func:`even_indices`)."""
        if not int(e["bpd_images"]):
            return np.zeros((0, 2))
        if "test" not in nets:
            nets["test"] = build_dataset(cfg["data"], "val")
        indices = even_indices(len(nets["test"]), int(e["bpd_images"]))[rank::world]
        return bits_per_dim_rows(
            model,
            diffusion,
            nets["test"],
            indices,
            next(model.parameters()).device,
            batch_size=int(e["batch_size"]),
            num_t_samples=e["bpd_t_samples"],
            buckets=int(e["bpd_buckets"]),
        )

    def hook(trainer) -> dict:
        acc = trainer.accelerator

        def net_fn(images: torch.Tensor) -> dict[str, torch.Tensor]:
            if "net" not in nets:  # built on the first images: their size picks the 32 px default
                nets["net"] = feature_network(
                    feature_extractor=e["feature_extractor"],
                    inception_weights=e["inception_weights"],
                    image_size=tuple(images.shape[-2:]),
                    device=acc.device,
                )
            return nets["net"](images)

        model = _ema_or_model(trainer)
        was_training = model.training
        model.eval()
        mine = rank_indices(n, acc.process_index, acc.num_processes)
        with acc.autocast():  # the training precision (bf16: about half the time of fp32)
            feats = sample_features(model, respaced, codec_fn(), mine, e, net_fn, acc.device)
            bpd_rows = test_bits_per_dim_rows(model, acc.process_index, acc.num_processes)
        bpd_parts = gather_object([bpd_rows])
        model.train(was_training)
        parts = gather_object([(mine, feats)])
        if not acc.is_main_process:
            return {}
        bpd = {}
        if int(e["bpd_images"]):
            bpd = bits_per_dim_summary(np.concatenate(bpd_parts), diffusion.num_steps, int(e["bpd_buckets"]))
        net = nets["net"]
        ref = nets.get("reference")
        if ref is None:
            ref = nets["reference"] = reference_statistics(e["reference"], net, e["cache_dir"], int(e["batch_size"]))
        out = metrics(merge_by_index(parts), ref, acc.device)
        points = [(r["step"], r["fid"]) for r in trainer.metrics.records() if "fid" in r and r["step"] < trainer.step]
        weights = "EMA " if trainer.ema is not None else ""
        plot = plot_metric(
            points + [(trainer.step, out["fid"])], "FID", out_dir / "fid.png", f"FID of {n} {weights}samples ({net.id})"
        )
        return {**out, **bpd, "eval_samples": n, "feature_space": net.id, "fid_plot": str(plot)}

    return hook


def train(cfg: dict, device: str = "auto", resume: bool | str = False) -> dict:
    """Train a recipe; returns the Trainer summary (also written to ``run.dir/results.json``, with the number of
    processes and the global / per-process batch) plus the run folder (``run_dir``). ``train.batch_size`` is the
    batch of one process and accumulation step.

    Args:
        device: "auto" (a GPU when one is visible), "cpu" or "cuda" (:func:`~lightvision.engine.device.resolve_device`).
        resume: True continues from the newest checkpoint of ``run.dir``, a path from that checkpoint or run folder;
            False starts fresh (refused if ``run.dir`` has checkpoints).

    Refused (:class:`~lightvision.engine.run_lock.RunFolderInUse`) while another process trains into ``run.dir``.
    """
    from accelerate import PartialState

    from lightvision.engine.device import resolve_device
    from lightvision.engine.run_lock import run_folder_lock

    check_recipe(cfg)
    cpu = resolve_device(device) == "cpu"
    state = PartialState(cpu=cpu)  # cpu: several CPU processes join one gloo group
    with run_folder_lock(cfg["run"]["dir"], state):
        return _train(cfg, state, cpu, resume)


def _train(cfg: dict, state: Any, cpu: bool, resume: bool | str) -> dict:
    """:func:`train` with the run folder locked, on the processes of ``state`` (``cpu``: forced onto the CPU)."""
    from lightvision.engine.trainer import Trainer, make_accelerator

    t = cfg["train"]
    seed = int(t["seed"])
    torch.manual_seed(seed)
    run_dir = Path(cfg["run"]["dir"])
    data = cfg["data"]
    dataset = build_dataset(data, "train")
    check_num_classes(cfg, dataset)
    scaling_factor = None
    if data["source"] == "latents":
        meta = dataset.meta
        channels, latent_size = meta["latent_shape"][0], meta["latent_shape"][1]
        scaling_factor = dataset.scaling_factor
    else:
        channels, latent_size = int(data["channels"]), int(data["image_size"])
        if cfg["autoencoder"]["kind"] != "pixel":
            raise ValueError(
                f"data.source {data['source']!r} trains in pixel space: set autoencoder.kind=pixel "
                "(or extract latents first for latent diffusion)"
            )
    arch = model_config(cfg, channels, latent_size)
    model = build_model(arch)
    init_report = None
    if cfg["model"]["init_from"]:
        from lightvision.diffusion.convert import init_from
        from lightvision.engine.weights import record_init

        source = cfg["model"]["init_from"]
        init_report = record_init(init_from(model, source), source, run_dir, state.is_main_process)
    diffusion = build_diffusion(cfg)
    per_process = int(t["batch_size"])
    global_batch = per_process * state.num_processes * int(t["grad_accum_steps"])
    workers = loader_workers(int(data["num_workers"]))
    loader = DataLoader(  # draws in the workers (pixel flips) keyed by (seed, epoch, position): replayed on resume
        KeyedDraws(dataset),
        sampler=KeyedSampler(len(dataset), seed),
        batch_size=per_process,
        drop_last=True,
        num_workers=workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=workers > 0,
    )
    o = cfg["optim"]
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=float(o["lr"]),
        betas=tuple(o["betas"]),
        weight_decay=float(o["weight_decay"]),
        **fused_kwargs(torch.optim.AdamW, state.device, o["fused"], "adamw"),
    )
    warmup = int(cfg["sched"]["warmup_steps"])
    scheduler = (
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup)) if warmup > 0 else None
    )
    codec_cache: list[Codec] = []

    def codec_fn() -> Codec:
        if not codec_cache:
            codec_cache.append(build_codec(cfg, state.device))
        return codec_cache[0]

    hooks = [(int(cfg["sample"]["every"]), sample_hook(cfg, diffusion, codec_fn, run_dir))]
    if int(t["eval_every_steps"]) > 0:
        if cfg["eval"]["reference"] is None:
            raise ValueError(
                "train.eval_every_steps needs eval.reference=PATH (image folder, .npz batch or "
                "`lightvision diffusion fid-ref` statistics)"
            )
        if int(t["eval_samples"]) <= PRC_NEIGHBOURHOOD:
            raise ValueError(
                f"train.eval_samples={t['eval_samples']}: precision / recall need more than {PRC_NEIGHBOURHOOD} samples"
            )
        hooks.append((int(t["eval_every_steps"]), eval_hook(cfg, diffusion, codec_fn, run_dir)))
    precision = (
        "no" if t["mixed_precision"] in (False, None) else str(t["mixed_precision"])
    )  # YAML 1.1 reads no as false
    trainer = Trainer(
        run_dir,
        cfg,
        model,
        optimizer,
        scheduler,
        loader,
        make_loss_fn(diffusion, scaling_factor),
        max_steps=int(t["max_steps"]),
        model_config=arch,
        grad_accum_steps=int(t["grad_accum_steps"]),
        clip_grad=o["clip_grad"],
        ema_decay=t["ema_decay"],
        mixed_precision=precision,
        log_every=int(t["log_every"]),
        ckpt_every=int(t["ckpt_every_steps"]),
        keep_last=int(t["keep_last"]),
        nan_policy=t["nan_policy"],
        seed=seed,
        hooks=hooks,
        torch_compile=compile_setting(t["compile"], t["compile_mode"]),
        profile_steps=t["profile_steps"],
        profile_host=t["profile_host"],
        graph_update=t["graph_update"],
        accelerator=make_accelerator(precision, int(t["grad_accum_steps"]), seed, cpu=cpu),
    )
    summary = trainer.fit(resume or None)
    summary.update(
        processes=state.num_processes,
        global_batch=global_batch,
        per_process_batch=per_process,
        **({"init_from": init_report} if init_report else {}),
    )
    if hasattr(dataset, "skipped_images"):  # image folders: unreadable images skipped (this process's count)
        summary["skipped_images"] = dataset.skipped_images()
    if state.is_main_process:
        from lightvision.engine.config import save_config

        save_config(summary, run_dir / "results.json")
    return {**summary, "run_dir": str(run_dir), "trainer": trainer}
