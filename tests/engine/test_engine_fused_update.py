"""``optim.fused``: which optimizers get ``fused=True`` where, the refusal for one without a fused form, and that the
fused update is the foreach update's (AdamW on DeiT-like parameter groups, a few steps)."""

from __future__ import annotations

import functools

import pytest
import torch
from timm.optim import Lamb

from lightvision.engine.fused_update import fused_kwargs


def test_default_is_fused_on_cuda_where_the_optimizer_has_it():
    assert fused_kwargs(torch.optim.AdamW, "cuda", None, "adamw") == {"fused": True}
    assert fused_kwargs(torch.optim.AdamW, torch.device("cuda", 1), None, "adamw") == {"fused": True}
    assert fused_kwargs(functools.partial(torch.optim.SGD, nesterov=True), "cuda", None, "sgd") == {"fused": True}
    assert fused_kwargs(torch.optim.AdamW, "cpu", None, "adamw") == {}  # the CPU keeps the optimizer's default
    assert fused_kwargs(Lamb, "cuda", None, "lamb") == {}  # no fused form: its own update


def test_explicit_choice_and_refusal():
    assert fused_kwargs(torch.optim.AdamW, "cpu", True, "adamw") == {"fused": True}
    assert fused_kwargs(torch.optim.AdamW, "cuda", False, "adamw") == {}
    assert fused_kwargs(Lamb, "cuda", False, "lamb") == {}
    with pytest.raises(ValueError, match="optim.fused=true: optimizer 'lamb' has no fused form"):
        fused_kwargs(Lamb, "cuda", True, "lamb")


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
def test_fused_update_matches_foreach(device):
    torch.manual_seed(0)
    shapes = [(197, 7), (7,), (3, 5, 2), (1,)]  # odd sizes, a bias, a scalar
    start = [torch.randn(s, device=device) for s in shapes]
    grads = [[torch.randn(s, device=device) for s in shapes] for _ in range(4)]
    params = {}
    fused = fused_kwargs(torch.optim.AdamW, device, None if device == "cuda" else True, "adamw")
    assert fused == {"fused": True}
    for name, extra in {"foreach": {"foreach": True}, "fused": fused}.items():
        ps = [torch.nn.Parameter(p.clone()) for p in start]
        groups = [{"params": ps[:2], "weight_decay": 0.05}, {"params": ps[2:], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, **extra)
        for step in grads:
            for p, g in zip(ps, step):
                p.grad = g.clone()
            opt.step()
        params[name] = ps
    assert not any(torch.equal(p, s) for p, s in zip(params["fused"], start))  # the steps moved every parameter
    for a, b in zip(params["fused"], params["foreach"]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_resumed_optimizer_keeps_its_checkpoints_form():
    """The form lives in the parameter groups that load_state_dict restores: a run started with foreach resumes with
    foreach even where the recipe now says fused, and the other way round."""
    for saved, resumed in (({"foreach": True}, {"fused": True}), ({"fused": True}, {"foreach": True})):
        model = torch.nn.Linear(3, 3)
        first = torch.optim.AdamW(model.parameters(), lr=1e-3, **saved)
        model(torch.randn(2, 3)).sum().backward()
        first.step()
        again = torch.optim.AdamW(model.parameters(), lr=1e-3, **resumed)
        again.load_state_dict(first.state_dict())
        group = again.param_groups[0]
        assert (bool(group["fused"]), bool(group["foreach"])) == (bool(saved.get("fused")), bool(saved.get("foreach")))
        again.step()  # and it steps
