"""timm's Mixup / CutMix (``mode="batch"``, corrected lambda) as a fixed sequence of batched device operations.

timm's :class:`~timm.data.Mixup` draws lambda, the mixup-or-cutmix switch and the box on the host (numpy) and runs
other operations for mixup than for cutmix. :class:`DeviceMixup` draws them on the batch's device from the current
:func:`~lightvision.engine.batch_random` (keyed by seed, step and micro-batch: a resumed run draws the same; its
``fork("mixup")``, apart from the augmentation's draws of the step), with
lambda ~ Beta(alpha, alpha) as G1 / (G1 + G2) of two Gamma(alpha) draws, and computes both mixes, each image keeping
the drawn one (:func:`~lightvision.kernels.mix.mix_reversed`, one program on CUDA): the same launches every step and
no host synchronisation, so the :class:`~lightvision.classify.graphed.GraphedCall` it runs through replays it as one
CUDA graph. :meth:`DeviceMixup.params` and :meth:`DeviceMixup.targets` let the train augmentation mix in its own
pass (:meth:`~lightvision.classify.device_transforms.DeviceTrainTransform.batch`).
"""

from __future__ import annotations

import torch
from timm.data.mixup import mixup_target

from lightvision.classify.graphed import DeviceConstants, GraphedCall
from lightvision.engine import batch_random
from lightvision.kernels.mix import mix_reversed

__all__ = ["DeviceMixup"]


class DeviceMixup:
    """``mixup(images, labels) -> (mixed images, soft targets)`` like timm's ``Mixup`` with these arguments.

    Args:
        mixup_alpha, cutmix_alpha: Beta parameters (0: that mix is off; not both).
        prob: probability that a batch is mixed at all; switch_prob: probability of cutmix when both are on.
        label_smoothing: the targets' smoothing; num_classes: width of the targets.
        graph: replay the mix as a CUDA graph on CUDA (:class:`~lightvision.classify.graphed.GraphedCall`).
    """

    def __init__(
        self,
        mixup_alpha: float,
        cutmix_alpha: float,
        prob: float,
        switch_prob: float,
        label_smoothing: float,
        num_classes: int,
        graph: bool = True,
    ):
        if mixup_alpha <= 0 and cutmix_alpha <= 0:
            raise ValueError("DeviceMixup needs aug.mixup > 0 or aug.cutmix > 0")
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.prob, self.switch_prob = prob, switch_prob
        self.smoothing, self.num_classes = label_smoothing, num_classes
        alphas = [a if a > 0 else 1.0 for a in (mixup_alpha, mixup_alpha, cutmix_alpha, cutmix_alpha)]
        self.alphas = DeviceConstants(torch.tensor([alphas], dtype=torch.float64))
        self.run_mix = GraphedCall(self.mix) if graph else self.mix

    def draw(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniforms float64 [1, 4] (mixed at all, cutmix, box centre y, x) and Gamma draws float64 [1, 4] (two for
        mixup's Beta, two for cutmix's) on ``device``."""
        br = batch_random().fork("mixup")  # not the draws the batch's augmentation made for this step
        u = br.rand((1, 4), device=device, dtype=torch.float64)
        (alphas,) = self.alphas.get(device)
        return u, torch._standard_gamma(alphas, generator=br.generator(device))

    def params(
        self, height: int, width: int, u: torch.Tensor, gammas: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The mix of a batch of ``height`` x ``width`` images from :meth:`draw`'s draws: (lam float64 [], cut bool [],
        box [4] top, bottom, left, right), :func:`~lightvision.kernels.mix.mix_reversed`'s arguments."""
        applied = u[0, 0] < self.prob
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            cutmix = u[0, 1] < self.switch_prob
        else:
            cutmix = torch.full((), self.cutmix_alpha > 0, device=u.device)
        beta = gammas[0, ::2] / (gammas[0, ::2] + gammas[0, 1::2])  # [mixup's, cutmix's]
        lam = torch.where(applied, torch.where(cutmix, beta[1], beta[0]), 1.0)
        # timm's rand_bbox: a box of the sides' sqrt(1 - lam), centred at a uniform pixel, clipped to the image
        ratio = (1 - lam).sqrt()
        cut_h, cut_w = (height * ratio).floor(), (width * ratio).floor()
        cy, cx = (u[0, 2] * height).floor(), (u[0, 3] * width).floor()
        top, bottom = (cy - (cut_h / 2).floor()).clamp(0, height), (cy + ((cut_h + 1) / 2).floor()).clamp(0, height)
        left, right = (cx - (cut_w / 2).floor()).clamp(0, width), (cx + ((cut_w + 1) / 2).floor()).clamp(0, width)
        cut = cutmix & (lam < 1)
        lam = torch.where(cut, 1 - (bottom - top) * (right - left) / (height * width), lam)
        return lam, cut, torch.stack([top, bottom, left, right])

    def targets(self, labels: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        """Soft targets float [N, classes] of labels int64 [N] mixed with weight ``lam`` (float64 [])."""
        return mixup_target(labels, self.num_classes, lam.float(), self.smoothing)

    def mix(
        self, x: torch.Tensor, labels: torch.Tensor, u: torch.Tensor, gammas: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x float [N, C, H, W] and labels int64 [N] mixed with the reversed batch, by :meth:`draw`'s draws ->
        (mixed [N, C, H, W], soft targets float [N, classes])."""
        lam, cut, box = self.params(*x.shape[-2:], u, gammas)
        return mix_reversed(x, lam, cut, box), self.targets(labels, lam)

    def __call__(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.run_mix(x, labels, *self.draw(x.device))
