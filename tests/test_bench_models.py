"""scripts/bench_models.py's CPU-side parts: token counts, the memory-growth exponents (the linear-memory
check), its tables and plot, and an argument error raised before any GPU is needed."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_models")


def _memory_records(attention: str, act_of_tokens, sizes=(224, 512, 1024), oom_at=()):
    out = []
    for px in sizes:
        n = (px // 16) ** 2 + 1  # DeiT: patch 16 and a class token
        base = {
            "model": "deit_s",
            "attention": attention,
            "img_size": px,
            "batch": 8,
            "tokens": n,
            "mode": "infer_memory",
        }
        if px in oom_at:
            out.append({**base, "oom": True})
        else:
            act = act_of_tokens(n)
            out.append({**base, "base_gb": 0.1, "peak_mem_gb": 0.1 + act, "activation_gb": act})
    return out


def test_token_count(bench):
    import timm

    from lightvision.diffusion import create_model

    deit = [timm.create_model("softmax_deit_tiny_patch16_224", img_size=px, depth=1) for px in (224, 512, 1024)]
    dit = [create_model("softmax_dit_s_2", input_size=px // 8, depth=1) for px in (256, 512, 1024)]
    assert [bench.token_count(m) for m in deit] == [197, 1025, 4097]
    assert [bench.token_count(m) for m in dit] == [256, 1024, 4096]


def test_memory_growth_exponents(bench):
    linear = _memory_records("lightnet", lambda n: 3e-4 * n)
    quadratic = _memory_records("lion_s_mask", lambda n: 1e-7 * n * n)
    # a fixed part on top of a linear one bends the exponent below 1, never above
    affine = _memory_records("lion_s", lambda n: 0.05 + 3e-4 * n)
    rows = {r["attention"]: r for r in bench.memory_growth(linear + quadratic + affine)}
    assert rows["lightnet"]["exponents"] == pytest.approx([1.0, 1.0])
    assert rows["lion_s_mask"]["max_exponent"] == pytest.approx(2.0)
    assert all(0 < e < 1 for e in rows["lion_s"]["exponents"])
    assert rows["lightnet"]["tokens"] == [197, 1025, 4097]
    expected = math.log(quadratic[2]["activation_gb"] / quadratic[1]["activation_gb"]) / math.log(4097 / 1025)
    assert rows["lion_s_mask"]["exponents"][1] == pytest.approx(expected)


def test_memory_growth_skips_oom_and_unordered_input(bench):
    recs = _memory_records("lion_s_mask", lambda n: 1e-7 * n * n, oom_at=(1024,))
    rows = bench.memory_growth(list(reversed(recs)))
    assert rows[0]["img_size"] == [224, 512] and len(rows[0]["exponents"]) == 1
    single = bench.memory_growth(_memory_records("softmax", lambda n: 1e-4 * n, sizes=(224,)))
    assert single[0]["exponents"] == [] and single[0]["max_exponent"] is None
    zero = bench.memory_growth(_memory_records("softmax", lambda n: 0.0, sizes=(224, 512)))
    assert zero[0]["exponents"] == [None] and zero[0]["max_exponent"] is None


def test_tables_and_plot(bench, tmp_path):
    recs = _memory_records("lightnet", lambda n: 3e-4 * n) + _memory_records(
        "lion_s_mask", lambda n: 1e-7 * n * n, oom_at=(1024,)
    )
    table = bench.markdown_table(recs)
    assert (
        f"| deit_s | lightnet | 1024 | eager | 8 | - | - | {0.1 + 3e-4 * 4097:.2f} / {3e-4 * 4097:.3f} (b=8) |" in table
    )
    assert "| deit_s | lion_s_mask | 1024 | eager | 8 | - | - | OOM |" in table
    growth = bench.memory_growth_table(bench.memory_growth(recs))
    assert (
        "| deit_s | lightnet | 8 | 224 (197): 0.059, 512 (1025): 0.307, 1024 (4097): 1.229 | 1.00, 1.00 | 1.00 |"
        in growth
    )
    assert "| deit_s | lion_s_mask | 8 |" in growth and "| 2.00 | 2.00 |" in growth
    timed = [
        {
            "model": "deit_s",
            "attention": "softmax",
            "img_size": 224,
            "batch": 256,
            "tokens": 197,
            "mode": m,
            "img_per_s": 1000.0,
            "peak_mem_gb": 8.0,
        }
        for m in ("infer", "train")
    ]
    bench.plot(recs + timed, tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 0


def test_ratios_to_softmax_per_compile_mode(bench):
    def rec(attention, compile_mode, img_per_s, peak, **kw):
        r = {"model": "dit_b", "attention": attention, "img_size": 256, "batch": 64, "mode": "train"}
        return (
            r
            | {"img_per_s": img_per_s, "peak_mem_gb": peak, **kw}
            | ({"compile": compile_mode} if compile_mode else {})
        )

    recs = [
        rec("softmax", None, 100.0, 10.0),
        rec("softmax", "default", 200.0, 8.0),
        rec("lightnet", None, 90.0, 12.0),
        rec("lightnet", "default", 220.0, 8.0),
        {"model": "dit_b", "attention": "lion_s", "img_size": 256, "batch": 64, "mode": "train", "oom": True},
        rec("lion_s", None, 50.0, 5.0, img_size=512),  # no softmax record at 512: no ratio
    ]
    rows = bench.ratios(recs)
    assert [(r["compile"], round(r["speed_vs_softmax"], 3), round(r["memory_vs_softmax"], 3)) for r in rows] == [
        ("eager", 0.9, 1.2),
        ("default", 1.1, 1.0),
    ]
    assert "| dit_b | lightnet | 256 | train | default | 1.10x | 1.00x |" in bench.ratio_table(rows)
    assert bench.compile_modes(None) == [None] and bench.compile_modes([]) == ["default"]
    assert bench.compile_modes(["none", "reduce-overhead"]) == [None, "reduce-overhead"]


def test_negative_memory_batch_is_refused(bench, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--memory-only", "--memory-batch", "-1", "--out", "/nonexistent/never_written.json"])
    assert exit_info.value.code == 2
    assert "--memory-batch must be >= 0" in capsys.readouterr().err


def test_dit_variants_build_their_model(bench):
    """A DiT entry is a kind (the registry's model with the latent's geometry) or a named variant with its model
    overrides."""
    from lightvision.diffusion import create_model

    with torch.device("meta"):
        plain, narrow = bench.build_dit("lightnet", "b", 256), bench.build_dit("lightnet_b_head64", "b", 256)
        registry = create_model("lightnet_dit_b_2", input_size=32, in_channels=4, num_classes=1000)
    public = lambda config: {k: v for k, v in config.items() if not k.startswith("_")}  # noqa: E731
    assert public(plain.config) == public(registry.config)
    assert plain.blocks[0].attn.num_heads == 6 and narrow.blocks[0].attn.num_heads == 12
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in narrow.parameters())
    with pytest.raises(ValueError, match="unknown attention kind or variant 'lightnet_b_head65'"):
        bench.build_dit("lightnet_b_head65", "b", 256)
