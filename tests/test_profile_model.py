"""scripts/profile_model.py's split of a step into matrix work, attention core and the rest (CPU: synthetic rows)."""

from __future__ import annotations

import pytest

from helpers import load_script


@pytest.fixture(scope="module")
def prof():
    load_script("bench_models")  # imported by name from scripts/
    return load_script("profile_model")


def test_categories_of_ops_and_kernels(prof):
    cores = prof.core_kernel_names()
    assert "_bwd_dq_kernel" in cores and "_fwd_fused_kernel" in cores  # LightNet / LION core kernels, by their names
    assert "_rms_norm_fwd_kernel" not in cores
    expect = {
        "aten::mm": "matrix",
        "aten::addmm": "matrix",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "matrix",
        "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN": "matrix",
        "triton_tem_fused_addmm_0": "matrix",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3": "attention",
        "fmha_cutlassB_bf16_aligned_64x64_k64_sm80": "attention",
        "_LightNetPackedEager": "attention",
        "lightvision::lion_packed_bwd": "attention",
        "_bwd_dkdv_kernel": "attention",
        "aten::copy_": "rest",
        "_adaln_fwd_kernel": "rest",
        "triton_poi_fused_add_mul_12": "rest",
    }
    assert {name: prof.category(name, cores) for name in expect} == expect


def test_split_sums_the_kernels_and_names_the_rest(prof):
    kernels = [
        {"name": "sm90_xmma_gemm_bf16", "ms": 5.0},
        {"name": "_fwd_fused_kernel", "ms": 2.0},
        {"name": "triton_poi_fused_add_mul_3", "ms": 1.0},
        {"name": "triton_poi_fused_add_mul_7", "ms": 0.5},
        {"name": "void at::native::elementwise_kernel<128, 2, at::native::Foo>(int)", "ms": 2.0},
    ]
    ops = [{"name": "aten::mm", "ms": 5.0}, {"name": "aten::copy_", "ms": 2.0}, {"name": "aten::add", "ms": 1.5}]
    compiled = prof.split_step(ops, kernels, compiled=True, top=5)
    assert (compiled["matrix_ms"], compiled["attention_ms"], compiled["rest_ms"]) == (5.0, 2.0, 3.5)
    assert compiled["rest_top"] == [
        {"name": "at::native::elementwise_kernel", "ms": 2.0},
        {"name": "triton_poi_fused_add_mul", "ms": 1.5},
    ]
    eager = prof.split_step(ops, kernels, compiled=False, top=1)
    assert eager["rest_top"] == [{"name": "aten::copy_", "ms": 2.0}]
    table = prof.split_table(
        [
            {"model": "dit_b", "img_size": 256, "batch": 256, "attention": "softmax", "compile": None}
            | {"cuda_ms_per_step": 10.5, "split": compiled}
        ]
    )
    assert "| dit_b | 256 | 256 | softmax | eager | 10.5 | 5.0 (48%) | 2.0 (19%) | 3.5 (33%) |" in table


def test_cases(prof):
    assert prof.parse_case("dit_b:512", None) == ("dit_b", 512, 64)
    assert prof.parse_case("deit_s:224", None) == ("deit_s", 224, 256)
    assert prof.parse_case("dit_b:512:16", 8) == ("dit_b", 512, 16)
    assert prof.parse_case("dit_b:300", 4) == ("dit_b", 300, 4)
    with pytest.raises(ValueError, match="no default batch"):
        prof.parse_case("dit_b:300", None)
    with pytest.raises(ValueError, match="MODEL:PX"):
        prof.parse_case("vit:224", None)


def test_bad_case_is_one_line(prof, capsys):
    with pytest.raises(SystemExit):
        prof.main(["--cases", "dit_b:abc"])
    assert "MODEL:PX[:BATCH]" in capsys.readouterr().err
