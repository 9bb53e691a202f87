"""`rbjax run`: the tiny study end to end (every stage, the report's tables and figure, the numbers equal the stage
files), reruns skip unchanged stages, a changed setting reruns only what depends on it, a study killed during a
sweep resumes without redoing finished work, and the paper study's dry run."""
import json
import re
import shutil
from pathlib import Path

import pytest

from rbjax.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "tiny.toml"
PAPER = ROOT / "experiments" / "paper.toml"

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def _offline(shared_dir):
    return ["--set", f"study.tokenizer={shared_dir / 'tokenizers' / 'gpt2'}",
            "--set", f"study.data_dir={shared_dir / 'redditbias'}",
            "--set", f"dialog.dst.multiwoz={shared_dir / 'dialog-data' / 'multiwoz'}"]


def _stages(out):
    return json.loads((Path(out) / "stages.json").read_text())["stages"]


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory, shared_dir):
    """experiments/tiny.toml as it is (2 seeds, 4 methods, every dialog check), with local data paths."""
    out = tmp_path_factory.mktemp("study") / "tiny"
    assert main(["run", str(TINY), "--out", str(out), "--no-progress", *_offline(shared_dir)]) == 0
    return out


def test_tiny_study_report_holds_every_table_and_figure(tiny_study):
    out = tiny_study
    st = _stages(out)
    assert all(v["status"] == "done" for v in st.values())
    names = set(st)
    assert {"model", "baseline/lmb_test", "baseline/dialog", "seed42/sweeps", "seed43/sweeps",
            "seed42/religion1/cda/run"} <= names
    for seed in (42, 43):
        for m in ("lmd", "add", "hd", "cda"):
            assert f"seed{seed}/religion1/{m}/lmb_test" in names and f"seed{seed}/religion1/{m}/dialog" in names
    md = (out / "report.md").read_text()
    for section in ("## Figure 1", "## LMB per bias type (Table 3 shape)", "## Effect sizes", "## Cross-type effects",
                    "### HD", "## Anti-stereotypical overshoots", "## Dialog quality", "## Data notes",
                    "## Settings and versions"):
        assert section in md, section
    assert "standing in for the train split" in md  # the MultiWOZ val split standing in for train is said
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 1 and "<table>" in html and "src='figure1.png'" not in html
    assert (out / "figure1.png").stat().st_size > 10_000


def test_report_numbers_equal_the_stage_files(tiny_study):
    """Table 3's baseline cells and the cross-type means are the t-values of the stage lmb.json files."""
    import statistics

    out = tiny_study
    from rbjax.study.report import write_report

    rep = write_report([out], out / "rebuilt")
    head, rows = rep["tables"]["table3"]
    base = {r["bias_type"]: r for r in json.loads((out / "baseline/lmb_test/lmb.json").read_text())}
    for col, b in enumerate(head[1:], start=1):
        assert rows[0][col].startswith(f"{base[b]['t_value']:.2f} (p ")
    hd = [json.loads((out / f"seed{s}/religion1/hd/lmb_test/lmb.json").read_text()) for s in (42, 43)]
    hd_rows = next(rows for m, h, rows in rep["tables"]["cross"] if m == "HD")
    for b in head[1:]:
        ts = [next(r["t_value"] for r in recs if r["bias_type"] == b) for recs in hd]
        cell = hd_rows[0][head.index(b)]  # the model debiased for religion1, measured on b
        assert cell.startswith(f"{statistics.fmean(ts):.2f} ± {statistics.stdev(ts):.2f}"), (b, cell, ts)
    # the selected grid points are those of each sweep's selection.json
    sel_head, sel_rows = rep["tables"]["selections"]
    assert len(sel_rows) == 6  # lmd, add, hd × 2 seeds (CDA has no grid)
    for row in sel_rows:
        method, seed = row[0], row[2]
        chosen = json.loads((out / f"seed{seed}/religion1/{method}/sweep/selection.json").read_text())["default"]
        assert row[sel_head.index("λ_D")] == f"{chosen['point']['lambda_d']:g}"
        assert row[sel_head.index("dev t")] == f"{chosen['dev']['t_value']:.2f}"
    assert "## Selected grid points" in (out / "rebuilt" / "report.md").read_text()
    dia_head, dia_rows = rep["tables"]["dialog"]
    lmp = json.loads((out / "baseline/dialog/lmp.json").read_text())["metrics"]["perplexity"]
    assert dia_rows[0][dia_head.index("LMP")] == f"{lmp:.3f}"
    # `rbjax report` rebuilds the same report from the folder
    assert main(["report", str(out), "--out", str(out / "again")]) == 0
    assert (out / "again" / "report.md").read_text() == (out / "rebuilt" / "report.md").read_text()


def test_rerun_skips_and_a_changed_setting_reruns_only_its_stages(tiny_study, shared_dir, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(tiny_study, out)
    before = _stages(out)
    capsys.readouterr()
    assert main(["run", str(TINY), "--out", str(out), "--no-progress", *_offline(shared_dir)]) == 0
    assert f"0 stage(s) ran, {len(before)} unchanged" in capsys.readouterr().out
    assert main(["run", str(TINY), "--out", str(out), "--no-progress", *_offline(shared_dir),
                 "--set", "dialog.lmp.lmp_max_lines=32"]) == 0
    text = capsys.readouterr()
    ran = set(re.findall(r"\[\d+/\d+\] (\S+) \.\.\.", text.err))
    assert ran == {n for n in before if n.endswith("/dialog")}, ran  # only the dialog checks read that setting
    lmp = json.loads((out / "baseline/dialog/lmp.json").read_text())
    assert lmp["metrics"]["n_scored_lines"] <= 32


def test_killed_study_resumes_without_redoing_finished_work(shared_dir, tmp_path, monkeypatch, capsys):
    """Ctrl-C in the second chunk of a sweep: the rerun skips the finished stages and the finished chunk."""
    from rbjax.debias import sweep

    out = tmp_path / "k"
    args = ["run", str(TINY), "--out", str(out), "--no-progress", *_offline(shared_dir),
            "--set", "study.seeds=[42]", "--set", "study.methods=[\"hd\"]", "--set", "dialog.tasks=[]",
            "--set", "sweep.grid_chunk=1", "--no-report"]
    real = sweep.run_chunk
    calls = []

    def dies_on_second(task):
        calls.append(task["chunk_id"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(task)

    monkeypatch.setattr(sweep, "run_chunk", dies_on_second)
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "interrupted in stage seed42/sweeps" in err and "run the same command again" in err
    done = _stages(out)
    assert {"model", "baseline/lmb_test"} <= set(done) and "seed42/sweeps" not in done
    recs = (out / "seed42/religion1/hd/sweep/sweep.jsonl").read_text().splitlines()
    assert len(recs) == 1
    monkeypatch.setattr(sweep, "run_chunk", lambda task: (calls.append(task["chunk_id"]), real(task))[1])
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "model: unchanged, skipped" in err and "baseline/lmb_test: unchanged, skipped" in err
    assert calls[2:] == calls[1:2]  # only the unfinished chunk ran again
    assert len((out / "seed42/religion1/hd/sweep/sweep.jsonl").read_text().splitlines()) == 2


def test_paper_study_dry_run_prints_the_plan_and_its_cost(capsys):
    assert main(["run", str(PAPER), "--out", "/nonexistent/runs/paper", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "training runs: 830" in text  # 5 types × (3 grid methods × (54 points + the retrained selection) + CDA)
    assert "seed42/sweeps" in text and "seed42/queerness/cda/dialog" in text and "estimated cost" in text
    assert main(["run", str(PAPER), "--out", "/nonexistent/x", "--dry-run", "--seeds", "3"]) == 0
    assert "training runs: 2490" in capsys.readouterr().out


def test_bad_study_files_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "s.toml"
    bad.write_text('[study]\nmodel = "m"\nmethods = ["xyz"]\n')
    assert main(["run", str(bad), "--out", str(tmp_path / "o"), "--dry-run"]) == 1
    assert "unknown method(s) ['xyz']" in capsys.readouterr().err
    bad.write_text('[study]\nmodel = "m"\n[sweeps]\n')
    assert main(["run", str(bad), "--out", str(tmp_path / "o"), "--dry-run"]) == 1
    assert "unknown section [sweeps]" in capsys.readouterr().err
    # a bad --set names the --set, not the (innocent) study file
    assert main(["run", str(PAPER), "--out", str(tmp_path / "o"), "--dry-run", "--set", "training.epochs=two"]) == 1
    assert "--set 'training.epochs=two': training.epochs must be an integer, got 'two'" in capsys.readouterr().err
    assert main(["run", str(PAPER), "--out", str(tmp_path / "o"), "--dry-run", "--set", "study.bogus=1"]) == 1
    assert "--set 'study.bogus=1': unknown field 'bogus' in [study]" in capsys.readouterr().err
    bad.write_text('[study\n')
    assert main(["run", str(bad), "--out", str(tmp_path / "o"), "--dry-run"]) == 1
    assert "not valid TOML" in capsys.readouterr().err


def test_report_renders_in_a_real_browser(tiny_study, tmp_path):
    """report.html in headless Chromium (Debian's package; no network): the tables are in the DOM, the one embedded
    figure is drawn (its bars' colour is on the screenshot). Runs where chromium is installed; elsewhere run
    `python scripts/check_report_browser.py runs/tiny/report.html` after `apt-get install chromium`."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    from check_report_browser import check, chromium

    if chromium() is None:
        pytest.skip("chromium is not installed (apt-get install chromium); see scripts/check_report_browser.py")
    res = check(tiny_study / "report.html", tmp_path / "shot.png")
    assert res["ok"], res
    assert res["tables"] >= 7 and res["images"] == 1
