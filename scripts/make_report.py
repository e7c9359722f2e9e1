"""Writes benchmarks/README.md, the speed and quality report, from the result files that benchmarks/report.yaml names.

    python scripts/make_report.py                      # rewrite benchmarks/README.md
    python scripts/make_report.py --check              # exit 1 if benchmarks/README.md is not what the files give

Every table is computed from its JSON files and headed by their hardware, torch / Triton versions, dates and the
softmax backend the YAML states for them; the prose around the tables comes from the YAML. Both modes first check
benchmarks/results/ against the YAML: every file there is listed by a section, every listed file is there, and every
name follows ``<what>_<device>_<yyyymmdd>.<ext>`` (device: the GPU and its count, e.g. ``h100x1``, ``h200x2``, or
``cpu``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from lightvision.tools.speed_tables import md_table, ratio_table, ratios, split_table, train_table

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "benchmarks" / "report.yaml"
OUT = ROOT / "benchmarks" / "README.md"
RESULTS = ROOT / "benchmarks" / "results"
NAME_RULE = re.compile(r"[a-z0-9]+(_[a-z0-9]+)*_([a-z0-9]+x\d+|cpu)_20\d{6}\.(json|png|md)")


def load(name: str) -> dict:
    """The result file ``benchmarks/results/<name>`` as a dict; a missing file is a ``FileNotFoundError`` naming it."""
    path = RESULTS / name
    if not path.is_file():
        raise FileNotFoundError(f"{path.relative_to(ROOT)} (named in {SPEC.relative_to(ROOT)}) does not exist")
    return json.loads(path.read_text())


def provenance(files: list[str], softmax: str | None) -> str:
    """One line per file: link, GPU, versions, date; then the softmax backend the figures used."""
    lines = []
    for name in files:
        env = load(name)["env"]
        triton = f", Triton {env['triton']}" if env.get("triton") else ""
        lines.append(
            f"- [`{name}`](results/{name}): {env['gpu']}, torch {env['torch']}{triton}, "
            f"{str(env.get('date') or 'date not recorded')[:10]}"
        )
    if softmax:
        lines.append(f"- softmax: {softmax}")
    return "Data:\n\n" + "\n".join(lines)


def _fwdbwd(records: list[dict]) -> dict:
    return {(r["op"], r["impl"], r["N"]): r["ms_graph"] for r in records if r["mode"] == "fwdbwd"}


def render_attention(files: list[str], **_) -> str:
    """fwd+bwd CUDA-graph ms per length: SDPA, LightNet, LION masked / scan, fla, LION-S with the mask materialised.
    The files' records are merged, a later file winning for the same (op, impl, N) (as plot_attention.py does)."""
    ms, shapes = {}, set()
    for name in files:
        records = load(name)["records"]
        ms |= _fwdbwd(records)
        shapes |= {(r["N"], r["B"]) for r in records}
    fmt = lambda v: "-" if v is None else f"{v:#.3g}" if v < 10 else f"{v:.1f}"  # noqa: E731
    rows = []
    for n, b in sorted(shapes):
        get = lambda op, impl: ms.get((op, impl, n))  # noqa: E731
        pair = lambda op: f"{fmt(get(op, 'triton_parallel'))} / {fmt(get(op, 'triton_scan'))}"  # noqa: E731
        rows.append(
            [
                f"{n} / {b}",
                fmt(get("softmax", "sdpa")),
                fmt(get("lightnet", "triton")),
                pair("lion_d"),
                pair("lion_s"),
                pair("lion_lit"),
                fmt(get("lion_s", "fla")),
                fmt(get("lion_s", "torch_mask")),
            ]
        )
    return md_table(
        [
            "N / B",
            "SDPA",
            "LightNet (one scan)",
            "LION-D masked / scan",
            "LION-S masked / scan",
            "LION-LIT masked / scan",
            "fla fwd+rev",
            "LION-S mask materialised",
        ],
        rows,
    )


def render_lightnet_vs_sdpa(files: list[str], **_) -> str:
    """LightNet kernel fwd and fwd+bwd CUDA-graph ms per length, its multiple of the memory floor, SDPA's fwd+bwd."""
    recs = {(r["op"], r["impl"], r["mode"], r["N"]): r for r in load(files[0])["records"]}
    rows = []
    for n, b in sorted({(r["N"], r["B"]) for r in recs.values() if r["op"] == "lightnet"}):
        fwd, both = recs[("lightnet", "triton", "fwd", n)], recs[("lightnet", "triton", "fwdbwd", n)]
        sdpa = recs[("softmax", "sdpa", "fwdbwd", n)]["ms_graph"]
        rows.append(
            [
                f"{n} / {b}",
                f"{fwd['ms_graph']:.3f}",
                f"{both['ms_graph']:.3f}",
                f"{both['x_floor_graph']:.2f}x",
                f"{sdpa:.3f}",
                f"{sdpa / both['ms_graph']:.1f}x",
            ]
        )
    return md_table(["N / B", "fwd", "fwd+bwd", "x memory floor", "SDPA fwd+bwd", "SDPA / LightNet"], rows)


def render_checks(files: list[str], **_) -> str:
    """Passed / total kernel checks against the fp64 reference and the largest fp32 error, per file."""
    rows = []
    for name in files:
        checks = load(name)["checks"]
        errors = [
            v
            for c in checks
            if c.get("dtype") == "float32"
            for k, v in c.items()
            if isinstance(v, float) and k not in ("decay",)
        ]
        rows.append(
            [
                name,
                load(name)["env"]["gpu"],
                f"{sum(c['ok'] for c in checks)} / {len(checks)}",
                f"{max(errors):.1e}" if errors else "-",
            ]
        )
    return md_table(["file", "GPU", "checks passed", "largest fp32 relative error"], rows)


def render_models(files: list[str], attentions: list[str] | None = None, **_) -> str:
    """Training images/s of every attention against softmax's in the same file (and round), with the ratio."""
    rows = []
    for name in files:
        by_key = defaultdict(dict)
        for r in load(name)["records"]:
            if r.get("mode") == "train":
                by_key[(r["model"], r["img_size"], r["batch"], r.get("round"))][r["attention"]] = r["img_per_s"]
        for (model, px, batch, rnd), speeds in by_key.items():
            base = speeds.get("softmax")
            for att, v in speeds.items():
                if att == "softmax" or base is None or (attentions and att not in attentions):
                    continue
                run = name if rnd is None else f"{name} (round {rnd})"
                rows.append([model, px, batch, att, f"{v:.0f}", f"{base:.0f}", f"{v / base:.3f}x", run])
    return md_table(["model", "px", "batch", "attention", "images/s", "softmax images/s", "ratio", "file"], rows)


def render_block_speed(files: list[str], **_) -> str:
    """Every training record of ``files`` (bench_models.py: images/s and peak GB), then each against softmax's record
    of the same model, size and compile mode in the same files."""
    train = [r for name in files for r in load(name)["records"] if r["mode"] == "train"]
    return train_table(train) + "\n\nAgainst softmax:\n\n" + ratio_table(ratios(train))


def render_profile_split(files: list[str], **_) -> str:
    """profile_model.py's split of a training step: matrix work, attention core and the rest (its three largest)."""
    return split_table([r for name in files for r in load(name)["profiles"]])


def render_gpu_tests(files: list[str], **_) -> str:
    """Passed / failed / seconds of each pytest suite run on a GPU, per file."""
    rows = [
        [s["stage"], f"`{s['command']}`", s["passed"], s["failed"], f"{s['seconds']:.0f}", name]
        for name in files
        for s in load(name)["suites"]
    ]
    return md_table(["stage", "suite", "passed", "failed", "seconds", "file"], rows)


def render_memory(files: list[str], **_) -> str:
    """Inference activation memory against the token count and its largest growth exponent (1 = linear)."""
    rows = []
    for name in files:
        for g in load(name)["memory_growth"]:
            rows.append(
                [
                    g["model"],
                    g["attention"],
                    g["batch"],
                    f"{g['tokens'][0]}-{g['tokens'][-1]}",
                    f"{g['activation_gb'][0]:.3f} -> {g['activation_gb'][-1]:.3f}",
                    f"{g['max_exponent']:.2f}",
                ]
            )
    return md_table(["model", "attention", "batch", "tokens", "activation GB", "largest growth exponent"], rows)


def render_classify_cifar10(files: list[str], **_) -> str:
    """Top-1 at the training size (32 px) and at 48 / 64 px without fine-tuning, per attention or variant and file; a
    run stopped before its end shows its last top-1 during training."""
    rows = []
    for name in files:
        for kind, r in load(name)["results"].items():
            top1 = {e["img_size"]: f"{e['top1']:.1f}" for e in r.get("eval", [])}
            if not top1 and r.get("top1_per_eval"):
                epoch, last = r["top1_per_eval"][-1]
                top1[32] = f"{last:.1f} at epoch {epoch:g} (stopped)"
            cells = [top1.get(size, "-") for size in (32, 48, 64)]
            rows.append([kind, f"{r['params'] / 1e6:.2f}M", *cells, name])
    return md_table(["attention", "params", "top-1 32 px", "48 px", "64 px", "file"], rows)


# The training switches of the resolution screen: the name suffix of each variant and what it sets.
SCREEN_SWITCHES = (("", "the recipe"), ("_sizes", "aug.sizes=[24, 32, 48]"), ("_scale", "aug.scale=[0.25, 1]"))


def top1(result: dict, pos: str) -> dict[int, float]:
    """{image size: top-1} of a classify benchmark run in one ``--eval-pos`` setting."""
    return {e["img_size"]: e["top1"] for e in result.get("eval", []) if e.get("pos") == pos}


def unit_curves(result: dict, lion_power: str) -> list[tuple[str, dict[int, float]]]:
    """(position unit, {size: top-1}) of a run in image units (LION at ``lion_power`` where it was evaluated so) and,
    where it differs (not for softmax's resampled embedding), in token units."""
    image = f"image:p={lion_power}" if top1(result, f"image:p={lion_power}") else "image"
    curves = [("image" if image == "image" else f"image, decay power {lion_power}", top1(result, image))]
    if top1(result, "token") != curves[0][1]:
        curves.append(("token", top1(result, "token")))
    return curves


def screen_kinds(results: dict) -> list[str]:
    """The attentions of a resolution screen (its names without a switch suffix)."""
    return [kind for kind in results if not kind.endswith(tuple(s for s, _ in SCREEN_SWITCHES if s))]


def sample_columns(report: dict) -> list[tuple[int, str]]:
    """(size, position unit) of the DiT sample sets of a resolution report, in order; token units only above the first
    (training) size, where the units are the same model."""
    sets = next(r["sizes"] for r in report["results"].values() if r.get("sizes"))
    first = sets[0]["img_size"]
    return [(x["img_size"], x["pos_unit"]) for x in sets if not (x["pos_unit"] == "token" and x["img_size"] == first)]


def head_of(result: dict) -> str:
    """The classifier head (``global_pool``) of a classify benchmark run: its recipe's, else its family's default."""
    from lightvision.classify.deit import FAMILIES, attention_of

    args = result["recipe"]["model"]["args"]
    return args.get("global_pool") or FAMILIES[attention_of(result["recipe"]["model"]["name"])].global_pool


def render_resolution(files: list[str], lion_power: str = "1", **_) -> str:
    """Top-1 at every evaluation size of each run (classify benchmark with ``--eval-pos``), in image units (LION at
    ``lion_power``) and token units, and the points lost from 32 to 64 px; a run without evaluations shows why."""
    rows = []
    for name in files:
        results = load(name)["results"]
        sizes = sorted({e["img_size"] for r in results.values() for e in r.get("eval", [])})
        for kind, r in results.items():
            if "error" in r:
                rows.append([kind, "-", r["error"], *[""] * len(sizes), ""])
                continue
            pool = head_of(r)
            for unit, acc in unit_curves(r, lion_power):
                rows.append([kind, pool, unit, *[f"{acc[s]:.1f}" for s in sizes], f"{acc[32] - acc[64]:.1f}"])
    return md_table(["attention", "head", "position unit", *[f"{s} px" for s in sizes], "lost 32 -> 64"], rows)


def render_resolution_settings(files: list[str], **_) -> str:
    """Top-1 at every evaluation size of each run in every ``--eval-pos`` setting it was evaluated in (position units,
    LION decay powers, one signal group in token units), and the points lost from 32 to 48 and to 64 px."""
    rows = []
    for name in files:
        results = load(name)["results"]
        sizes = sorted({e["img_size"] for r in results.values() for e in r.get("eval", [])})
        for kind, r in results.items():
            for pos in dict.fromkeys(e["pos"] for e in r.get("eval", [])):
                acc = top1(r, pos)
                lost = [f"{acc[32] - acc[s]:.1f}" for s in (48, 64)]
                rows.append([kind, head_of(r), pos, *[f"{acc[s]:.1f}" for s in sizes], *lost])
    return md_table(
        ["attention", "head", "--eval-pos", *[f"{s} px" for s in sizes], "lost 32 -> 48", "lost 32 -> 64"], rows
    )


def render_resolution_screen(files: list[str], **_) -> str:
    """Top-1 at 32 / 48 / 64 / 96 px (image units) of each attention under each training switch of the screen."""
    rows = []
    for name in files:
        results = load(name)["results"]
        for kind in screen_kinds(results):
            for suffix, label in SCREEN_SWITCHES:
                acc = top1(results.get(kind + suffix, {}), "image")
                rows.append([kind, label, *[f"{acc[s]:.1f}" if s in acc else "-" for s in (32, 48, 64, 96)]])
    return md_table(["attention", "training", "32 px", "48 px", "64 px", "96 px"], rows)


def render_resolution_samples(files: list[str], **_) -> str:
    """Streak share of DiT samples at each size and position unit (the real test images' first)."""
    rows = []
    for name in files:
        report = load(name)
        columns = sample_columns(report)
        rows.append(["real test images", *[f"{report['real_streak_share']['mean']:.2f}"] * len(columns)])
        for kind, r in report["results"].items():
            if r.get("sizes"):
                share = {(x["img_size"], x["pos_unit"]): x["streak_share"]["mean"] for x in r["sizes"]}
                row = [f"{kind} ({r['test_bits_per_dim']:.2f} bits/dim)", *[f"{share[c]:.2f}" for c in columns]]
                rows.append(row)
    return md_table(["run", *[f"{size} px {unit}" for size, unit in columns]], rows)


def render_training_rate(files: list[str], **_) -> str:
    """Training images/s per setting and attention: the median of each run's steady log windows."""
    settings = [s for name in files for s in load(name)["settings"]]
    kinds = list(dict.fromkeys(k for s in settings for k in s["images_per_s"]))  # in order of first appearance
    rows = []
    for s in settings:
        rates = s["images_per_s"]
        cells = [f"{statistics.median(rates[k]):,.0f}" if k in rates else "-" for k in kinds]
        rows.append([s["setting"], s["batch"], s["compile_mode"], *cells])
    return md_table(["setting", "batch", "compile mode", *kinds], rows)


def render_yardstick(files: list[str], **_) -> str:
    """CIFAR-10 yardstick recipes: widths, residual stages, cutout, epochs, test top-1 of one view and flip-averaged."""
    rows = [
        [
            "-".join(str(w) for w in r.get("widths", (64, 128, 256, 512))),
            ", ".join(str(i + 1) for i, res in enumerate(r.get("residual", (True, False, True))) if res),
            r["cutout"] or "-",
            r["epochs"],
            f"{r['test_top1']:.2f}",
            r.get("test_top1_flip_tta", "-"),
            r["source"],
        ]
        for r in load(files[0])["results"]
    ]
    head = ["widths", "residual stages", "cutout", "epochs", "test top-1, one view", "flip-averaged", "where"]
    return md_table(head, rows)


def render_input_pipeline(files: list[str], **_) -> str:
    """DeiT training images/s per input setting (loaders alone: what their workers supply) against the synthetic input
    of the same run (a setting's own ``vs_synthetic`` where the file records one) and the Trainer run without input
    (``vs_train_synthetic``), the share of the time the training loop waited for its next batch, the batch
    preparation's wall (CPU) ms on its thread, loader cores, per-stage ms per batch of the stage-timed loops, the rate
    of each logged window where the file has them (thousands of images/s); settings that did not run say why."""
    rows = []
    for name in files:
        results = load(name)["results"]
        ceiling = results.get("synthetic", {}).get("images_per_s")
        for setting, r in results.items():
            if "images_per_s" not in r:
                rows.append([setting, "-", r.get("error") or r.get("skipped", ""), *["-"] * 8, name])
                continue
            share = r.get("vs_synthetic", r["images_per_s"] / ceiling if ceiling else None)
            shares = [f"{v:.0%}" if v is not None else "-" for v in (share, r.get("vs_train_synthetic"))]
            wait = f"{r['input_wait_share']:.0%}" if "input_wait_share" in r else "-"
            prepare = "-"
            if "input_prepare_ms" in r:
                prepare = f"{r['input_prepare_ms']:.1f} ({r['input_prepare_cpu_ms']:.1f})"
            stages = [f"{r[k]:.1f}" if k in r else "-" for k in ("decode_ms", "augment_ms", "step_ms")]
            rate = f"{r['images_per_s']:.0f}"
            windows = " ".join(f"{w['images_per_s'] / 1000:.1f}" for w in r.get("windows", [])) or "-"
            rows.append([setting, r.get("cores", "-"), rate, *shares, wait, prepare, *stages, windows, name])
    header = ["input", "loader cores", "images/s", "of synthetic", "of train_synthetic", "input wait"]
    header += ["prepare ms (CPU)", "decode ms", "augment ms", "step ms", "per window (k/s)"]
    return md_table(header + ["file"], rows)


def render_input_overlap(files: list[str], **_) -> str:
    """``bench_input.py --overlap``: the step's images/s beside a thread preparing one batch a step (decode,
    augmentation, both) per switch interval, as a share of the step alone, the batches that thread finished per step and
    its milliseconds per batch."""
    rows = []
    for name in files:
        for r in (r for r in load(name)["results"].values() if "work" in r):  # (the loop settings have none)
            done = f"{r['prepare_ms']:.0f}" if r.get("prepare_ms") is not None else "-"
            rows.append(
                [
                    r["work"],
                    f"{r['switch_ms']:g}",
                    f"{r['images_per_s']:.0f}",
                    f"{r['vs_alone']:.0%}",
                    f"{r['prepared_per_step']:.2f}",
                    done,
                    name,
                ]
            )
    head = ["work beside the step", "switch ms", "step images/s", "of the step alone", "batches prepared a step"]
    return md_table(head + ["ms per batch prepared", "file"], rows)


def render_decode_beside_step(files: list[str], **_) -> str:
    """``bench_decode_beside_step.py``: per decoder and setting of the step, a batch's decode alone and beside the
    running compiled step (ms per batch, batches decoded per step, the step's rate against alone), and the step fed by
    that decoder against the step alone."""
    rows = []
    for name in files:
        d = load(name)
        alone, fed = d["alone_ms_per_batch"], d.get("fed", {})
        for key, r in d["beside"].items():
            cells = [f"{alone[r['decoder']]:.1f}", f"{r['decode_ms']:.0f}", f"{r['decoded_per_step']:.2f}"]
            cells.append(f"{r['vs_alone']:.0%}")
            fed_share = f"{fed[key]['vs_step_alone']:.0%}" if key in fed else "-"
            rows.append([d["study"].replace("_", " "), r["decoder"], r["step"], *cells, fed_share, name])
    head = ["study", "decoder", "step", "alone ms / batch", "beside ms / batch", "batches decoded a step"]
    return md_table(head + ["step rate of alone", "fed step of alone", "file"], rows)


def render_diffusion_cifar10(files: list[str], **_) -> str:
    """Per DiT run of ``scripts/run_variants.py`` reports: params, steps, test bits/dim, FID / precision / recall in
    the report's feature network ("-" for runs without them), streak share (the real test images' first) and the
    shared-GPU steps/s."""
    metric = lambda r, key, fmt: "-" if r.get(key) is None else format(r[key], fmt)  # noqa: E731
    first = load(files[0])
    real = first["real_streak_share"]
    rows = [["real test images", "", "", "", "", "", "", f"{real['mean']:.3f}", ""]]
    for name in files:
        for kind, r in load(name)["results"].items():
            if "error" in r:
                rows.append([kind, "error", "", "", "", "", "", "", ""])
                continue
            rows.append(
                [
                    f"{kind} ({r['model']})",
                    f"{r['params'] / 1e6:.1f}M",
                    r["steps"],
                    f"{r['test_bits_per_dim']:.3f}",
                    metric(r, "fid", ".1f"),
                    metric(r, "precision", ".3f"),
                    metric(r, "recall", ".3f"),
                    f"{r['streak_share']['mean']:.3f}",
                    r["train_steps_per_s"],
                ]
            )
    return md_table(
        [
            "run",
            "params",
            "steps",
            "test bits/dim",
            "FID",
            "precision",
            "recall",
            "streak share",
            "steps/s (shared GPU)",
        ],
        rows,
    )


def render_dit_curves(files: list[str], **_) -> str:
    """FID and test bits/dim of each run at each evaluation step (``scripts/plot_dit_curves.py`` files, runs side by
    side), then each run's logged steps/s; "-" where a run had stopped before that step."""
    runs = {name: run for f in files for name, run in load(f)["runs"].items()}
    at = {name: {c["step"]: c for c in run["curve"]} for name, run in runs.items()}
    steps = sorted({step for curve in at.values() for step in curve})
    cell = lambda c: "-" if c is None else f"{c['fid']:.1f} / {c['test_bits_per_dim']:.3f}"  # noqa: E731
    rows = [[f"{step:,}", *(cell(at[name].get(step)) for name in runs)] for step in steps]
    rows.append(["steps/s", *(f"{run['train_steps_per_s']}" for run in runs.values())])
    return md_table(["step", *(f"{name}: FID / bits/dim" for name in runs)], rows)


def render_multi_gpu(files: list[str], **_) -> str:
    """1 vs 2 GPUs at the same global batch: first loss, loss differences, images/s, and 2 GPUs at twice the batch."""
    d = load(files[0])
    rows = []
    for job in ("classify", "diffusion"):
        j = d[job]
        c = j["comparison"]
        step1 = c["per_step"][0]
        speed = lambda run: j[run]["throughput"]["images_per_s"]  # noqa: E731
        rows.append(
            [
                f"{job} ({d['settings'][job + '_model']})",
                f"{step1['loss_1']:.5f} / {step1['loss_2']:.5f}",
                f"{c['loss_diff']['first_10']['max_rel']:.1e} / {c['loss_diff']['all']['max_rel']:.1e}",
                f"{speed('run_1'):.0f} -> {speed('run_2'):.0f} (x{speed('run_2') / speed('run_1'):.2f})",
                f"{speed('run_2_weak'):.0f} (x{speed('run_2_weak') / speed('run_1'):.2f})",
            ]
        )
    return md_table(
        [
            "job",
            "loss step 1 (1 / 2 GPUs)",
            "max relative loss difference, first 10 / all steps",
            "images/s 1 GPU -> 2 GPUs (same global batch)",
            "2 GPUs, twice the global batch",
        ],
        rows,
    )


RENDER = {k[len("render_") :]: v for k, v in globals().items() if k.startswith("render_")}


def named_files(spec: dict) -> list[str]:
    """Every result file the report spec names (tables, provenance and plain links), in order."""
    names = []
    for section in spec["sections"]:
        names += section.get("files", []) + section.get("links", [])
    return names


def check_results(spec: dict) -> None:
    """Raises ``FileNotFoundError`` for a file the spec lists that is not under benchmarks/results/, ``ValueError`` for
    a file there that no section lists or whose name breaks ``NAME_RULE``."""
    spec_path = SPEC.relative_to(ROOT)
    named = named_files(spec)
    for name in named:
        if not (RESULTS / name).is_file():
            raise FileNotFoundError(f"benchmarks/results/{name} (named in {spec_path}) does not exist")
    present = sorted(p.name for p in RESULTS.iterdir())
    unlisted = [name for name in present if name not in set(named)]
    if unlisted:
        more = f" (and {len(unlisted) - 1} more)" if len(unlisted) > 1 else ""
        raise ValueError(
            f"benchmarks/results/{unlisted[0]}{more} is not listed in {spec_path}: "
            "add it to a section's files or links, or delete it"
        )
    for name in present:
        if not NAME_RULE.fullmatch(name):
            raise ValueError(
                f"benchmarks/results/{name} breaks the naming rule <what>_<device>_<yyyymmdd>.<ext> "
                "(e.g. attention_fwd_bwd_h100x1_20261125.json): rename it and its references"
            )


def anchor(title: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def build(spec: dict) -> str:
    """The report's markdown from ``spec`` (the parsed YAML): the intro, the questions (level-2 sections) as contents,
    then every section under its heading."""
    questions = [s["title"] for s in spec["sections"] if s.get("level") == 2]
    contents = "\n".join(f"- [{title}](#{anchor(title)})" for title in questions)
    parts = [f"# {spec['title']}", spec["intro"].strip(), contents]
    for section in spec["sections"]:
        parts.append(f"{'#' * section.get('level', 3)} {section['title']}")
        if section.get("text"):
            parts.append(section["text"].strip())
        if section.get("table"):
            parts.append(RENDER[section["table"]](section["files"], **section.get("options", {})))
        if section.get("after"):
            parts.append(section["after"].strip())
        if section.get("files"):
            parts.append(provenance(section["files"], section.get("softmax")))
    parts.append("<!-- generated by scripts/make_report.py from benchmarks/report.yaml: edit those, not this file -->")
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with benchmarks/README.md instead of writing it")
    args = p.parse_args(argv)
    try:
        spec = yaml.safe_load(SPEC.read_text())
        check_results(spec)
        text = build(spec)
    except (FileNotFoundError, KeyError, ValueError, yaml.YAMLError) as err:
        print(f"make_report: error: {err}", file=sys.stderr)
        return 1
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(
                "make_report: benchmarks/README.md is out of date: run python scripts/make_report.py", file=sys.stderr
            )
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
