"""scripts/make_report.py on the committed results: every file it names exists and every file under
benchmarks/results/ is named (by the one naming rule, without absolute paths), benchmarks/README.md is what the files
give, every table carries its data's GPU and versions, and a missing or unlisted file is one clear error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report():
    return load_script("make_report")


@pytest.fixture(scope="module")
def spec(report):
    return yaml.safe_load(report.SPEC.read_text())


def test_every_named_file_exists(report, spec):
    names = report.named_files(spec)
    assert len(names) > 20
    missing = [n for n in names if not (report.RESULTS / n).is_file()]
    assert not missing


def test_every_result_file_is_listed_and_named_by_the_rule(report, spec):
    report.check_results(spec)
    names = sorted(p.name for p in report.RESULTS.iterdir())
    assert sorted(set(report.named_files(spec))) == names
    assert all(report.NAME_RULE.fullmatch(n) for n in names)


def test_no_absolute_paths_in_the_result_files(report):
    absolute = re.compile(r"(?<![\w.~/-])/(?:work|root|tmp|home|opt|usr|mnt|data|scratch)/")
    assert [p.name for p in report.RESULTS.glob("*.json") if absolute.search(p.read_text())] == []


def test_recorded_commands_are_relative_to_the_repository_root():
    from lightvision.tools.results import REPO_ROOT, results_env

    command = f"python {REPO_ROOT}/scripts/bench_models.py --out {REPO_ROOT}/benchmarks/results/m.json --data /d"
    assert results_env(command)["command"] == "python scripts/bench_models.py --out benchmarks/results/m.json --data /d"


def test_committed_report_is_current(report, spec):
    assert report.OUT.read_text() == report.build(spec), "run python scripts/make_report.py"
    assert report.main(["--check"]) == 0


def test_every_link_of_the_report_resolves(report):
    text = report.OUT.read_text()
    links = re.findall(r"\]\(([^)#]+)", text)
    assert links
    assert [link for link in links if not (report.OUT.parent / link).exists()] == []


def test_tables_name_hardware_versions_and_softmax_backend(report, spec):
    text = report.build(spec)
    for section in spec["sections"]:
        if section.get("table") is None:
            continue
        body = text.split(f"# {section['title']}\n", 1)[1].split("\n#", 1)[0]
        for name in section["files"]:
            env = report.load(name)["env"]
            assert f"`{name}`" in body and env["gpu"] in body and f"torch {env['torch']}" in body
        assert "- softmax: " in body


def test_one_section_per_question_listed_as_contents(report, spec):
    questions = [s["title"] for s in spec["sections"] if s.get("level") == 2]
    assert questions == [
        "Correctness",
        "Attention speed",
        "Model speed and memory",
        "Classification quality and resolution transfer",
        "Diffusion quality",
        "Input rate",
        "Scaling over GPUs",
    ]
    text = report.build(spec)
    for title in questions:
        assert f"\n## {title}\n" in text and f"- [{title}](#{report.anchor(title)})" in text
    assert report.anchor("Classification quality and resolution transfer") == (
        "classification-quality-and-resolution-transfer"
    )
    assert report.anchor("Where a training step's time goes") == "where-a-training-steps-time-goes"


def test_tables_are_computed_from_the_files(report, spec):
    """The attention table's SDPA cell at N = 196 is the last listed file's fwd+bwd CUDA-graph median (a later file
    wins where the files overlap); the fla cell comes from the only file that has fla."""
    section = next(s for s in spec["sections"] if s.get("table") == "attention")

    def fwdbwd_196(name, op, impl):
        records = report.load(name)["records"]
        match = (op, impl, "fwdbwd", 196)
        return next((r["ms_graph"] for r in records if (r["op"], r["impl"], r["mode"], r["N"]) == match), None)

    cells = next(line for line in report.build(spec).splitlines() if line.startswith("| 196 / 256 |")).split(" | ")
    assert cells[1] == f"{fwdbwd_196(section['files'][-1], 'softmax', 'sdpa'):#.3g}"
    fla = [ms for name in section["files"] if (ms := fwdbwd_196(name, "lion_s", "fla")) is not None]
    assert len(fla) == 1 and cells[6] == f"{fla[0]:#.3g}"


def one_line_error(report, spec, monkeypatch, capsys) -> str:
    """make_report --check's message on ``spec``: exit code 1 and a single line."""
    monkeypatch.setattr(report.yaml, "safe_load", lambda _: spec)
    assert report.main(["--check"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    return err


@pytest.mark.parametrize("key, name", [("files", "no_such_result.json"), ("links", "no_such_plot_h100x1_20261125.png")])
def test_a_missing_file_is_one_clear_error(report, spec, monkeypatch, capsys, key, name):
    broken = {**spec, "sections": [{**spec["sections"][1], key: [name]}]}
    err = one_line_error(report, broken, monkeypatch, capsys)
    assert name in err and "does not exist" in err


def test_an_unlisted_result_file_is_one_clear_error(report, spec, monkeypatch, capsys):
    dropped = spec["sections"][-1]
    err = one_line_error(report, {**spec, "sections": spec["sections"][:-1]}, monkeypatch, capsys)
    assert "is not listed in benchmarks/report.yaml" in err and dropped["files"][0] in err


@pytest.mark.parametrize(
    "name", ["lion_h100_20261123b.json", "grids_20261125.png", "run_20261125_h100x1.json", "x_h100_20261125.json"]
)
def test_a_name_off_the_rule_is_refused(report, tmp_path, monkeypatch, name):
    (tmp_path / name).write_text("{}")
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    with pytest.raises(ValueError, match="naming rule"):
        report.check_results({"sections": [{"title": "t", "links": [name]}]})


def test_no_work_bookkeeping_in_the_report(report):
    assert not re.search(r"(?i)session ?\d+|issue #\d+|target", report.OUT.read_text())


def test_curve_table_is_the_files_curves(report, spec):
    """Each cell of the B/2 curve table is that run's evaluation at that step; a run that stopped earlier shows "-"."""
    section = next(s for s in spec["sections"] if s.get("table") == "dit_curves")
    runs = report.load(section["files"][0])["runs"]
    lines = report.render_dit_curves(section["files"]).splitlines()
    last = {name: run["curve"][-1]["step"] for name, run in runs.items()}
    step = min(last.values())
    cells = next(line for line in lines if line.startswith(f"| {step:,} |")).strip("| ").split(" | ")
    for cell, run in zip(cells[1:], runs.values()):
        point = next(c for c in run["curve"] if c["step"] == step)
        assert cell == f"{point['fid']:.1f} / {point['test_bits_per_dim']:.3f}"
    later = next(line for line in lines if line.startswith(f"| {max(last.values()):,} |")).strip("| ").split(" | ")
    assert [c == "-" for c in later[1:]] == [s < max(last.values()) for s in last.values()]
