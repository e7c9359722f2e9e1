"""scripts/block_costs.py on the CPU: a small DiT's Linear layers, FLOPs and what a block keeps for its backward."""

from __future__ import annotations

import json

from helpers import load_script


def test_block_costs_of_a_small_dit(tmp_path):
    load_script("bench_models")  # imported by name from scripts/
    costs = load_script("block_costs")
    out = tmp_path / "costs.json"
    assert costs.main(["--size", "s", "--px", "48", "--attentions", "softmax", "lightnet", "--out", str(out)]) == 0
    softmax, lightnet = json.loads(out.read_text())["models"]
    assert (softmax["depth"], lightnet["depth"]) == (12, 18)
    assert [layer["name"] for layer in lightnet["linears"]] == [
        "attn.qkv",
        "attn.gate.0",
        "attn.gate.1",
        "attn.proj",
        "ffn.w12",
        "ffn.w3",
    ]
    gemm = {
        m["attention"]: m["gflop_per_image"]["mm"] + m["gflop_per_image"].get("addmm", 0) for m in (softmax, lightnet)
    }
    assert 1.4 < gemm["lightnet"] / gemm["softmax"] < 1.7  # 18 blocks of 12.33 D^2 per token against 12 of 12 D^2
    for model in (softmax, lightnet):
        # the residual stream stays bf16, and neither FFN keeps its activation's output (only its input)
        assert all(s["dtype"] != "float32" or s["bytes_per_token_channel"] < 0.1 for s in model["saved"])
        assert not any(
            s["made_by"].startswith(("Gelu", "Silu", "EagerBackward")) and s["shape"][-1] in (1536, 1024)
            for s in model["saved"]
        )
    # what the layers' own saved-tensor hooks keep as it is still counts: the qkv projection (bf16, 3 x 384 wide)
    assert all(any(s["bytes_per_token_channel"] == 6 for s in m["saved"]) for m in (softmax, lightnet))
    assert 10 < softmax["saved_bytes_per_token_channel"] < lightnet["saved_bytes_per_token_channel"] < 40
