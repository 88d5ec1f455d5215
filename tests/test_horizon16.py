"""The horizon16 report on synthetic trunks: bits per byte, the declared Holm families at the primary horizon,
the validation set's own standard error from per-document nats, the multiplier's edge flag, and a fresh
checkout reading the published rows (per-document nats included)."""
import json
import math
import random
from types import SimpleNamespace

import pytest

from data.files import atomic_write

DOCS = [300, 500, 200]          # bytes per validation document


def fake(cell, lr, mult, seed, steps):
    """Per-document nats with a known optimum (lr 3e-3), a cell effect and a per-seed offset shared by cells."""
    effect = {"gpt2.pre_ln": 0.0, "gpt2.geonorm-normin": -0.2, "gpt2.sandwich": -0.1,
              "gpt2.peri_ln": 0.002 * ((seed * 7) % 5 - 2)}[cell]     # Peri-LN: no effect, seed noise
    if cell == "gpt2.geonorm-normin" and mult == 10:
        effect -= 0.05
    base = 2.0 + 0.3 * math.log10(lr / 3e-3) ** 2 + effect + 0.03 * seed + 10.0 / steps
    # document d gets a small per-document wobble, so the validation set's own s.e. is not zero
    # (GeoNorm gains more on the last document: its gap varies over the validation set)
    tilt = 0.03 if cell == "gpt2.geonorm-normin" else 0.0
    return [nbytes * (base + (0.01 * (1 + seed % 3) + tilt) * (d - 1)) for d, nbytes in enumerate(DOCS)]


@pytest.fixture
def env(tmp_path, monkeypatch):
    from experiments import horizon as hz, study as S

    study = S.Study.load("horizon16")
    study.cells = {c: {"overrides": {}, "start": 3e-3} for c in
                   ("gpt2.pre_ln", "gpt2.geonorm-normin", "gpt2.peri_ln", "gpt2.sandwich")}
    study.cells["gpt2.geonorm-normin"]["scalar_lr_mults"] = [1, 10]
    part = {"name": "p16", "kind": "horizon", "sweep": "s", "cells": list(study.cells), "horizons": [4, 16],
            "primary_horizon": 16, "test_seeds": [2, 3, 4, 5], "decay_frac": 0.2,
            "primary": ["gpt2.geonorm-normin", "gpt2.peri_ln"], "ablation": ["gpt2.sandwich"]}
    study.parts = [part]

    def fake_run(out, horizons, decay, overrides, warmup=0, log=None, env=None):
        o = dict(a.split("=", 1) for a in overrides)
        point = json.loads((out / "point.json").read_text())
        rows = {}
        for h in horizons:
            nats = fake(point["cell"], float(o["optim.lr"]), float(o[hz.MULT_KEY]), int(o["train.seed"]), h)
            run_dir = out / f"h{h}"
            run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(run_dir / "final_eval.json", json.dumps({"docs": {"nats": nats, "bytes": DOCS}}))
            loss = sum(nats) / sum(DOCS)
            rows[h] = {"steps": h, "tokens": h * 1024, "final_val_loss": loss, "final_val_bpb": loss / math.log(2),
                       "diverged": False, "train_s": 1.0, "run_dir": str(run_dir), "spikes_loss": 0,
                       "max_grad_norm": 1.5}
        atomic_write(out / "horizons.json", json.dumps({"horizons": rows}))  # as branches.run: readers run meanwhile

    monkeypatch.setattr(hz.branches, "run", fake_run)
    monkeypatch.setattr(hz, "reference_setting", lambda *a: (1024, 1024, 1))
    monkeypatch.setattr(hz, "HOLD_S", 0.01)
    args = SimpleNamespace(runs_root=tmp_path / "runs", docs=tmp_path / "docs", experiment="horizon16", overrides=[],
                           jobs=2)
    return hz, study, part, SimpleNamespace(study=study, args=args, cells=study.cells)


def test_the_report_decides_the_declared_families_in_bits_per_byte(env, tmp_path):
    hz, study, part, runner = env
    hz.run_part(runner, part)
    from studies.horizon16 import report as r16

    rows = hz.collect(runner.args.runs_root, part)
    assert all(len(r["doc_nats"]) == 3 and "final_val_bpb" in r for r in rows)
    cells = {c: r16.Cell(rows, c, 16.0, [0, 1], part["test_seeds"]) for c in part["cells"]}
    geo_cell = cells["gpt2.geonorm-normin"]
    # the best multiplier (10, the largest of the file's) got a step up, and is then inside what was tried
    assert geo_cell.setting == (3e-3, 10.0) and (3e-3, 100.0) in geo_cell.grid and geo_cell.edge == ""
    geo_cell.grid = {k: v for k, v in geo_cell.grid.items() if k[1] <= 10}
    assert geo_cell.edge == "mult"       # without that step, the table would flag it
    assert cells["gpt2.pre_ln"].setting == (3e-3, 1.0) and cells["gpt2.pre_ln"].edge == ""
    fam = [r16.compare(cells[c], cells["gpt2.pre_ln"], DOCS) for c in part["primary"]]
    r16.family(fam)
    geo, peri = fam
    tilt = 0.03 * sum(b * (d - 1) for d, b in enumerate(DOCS)) / sum(DOCS)
    assert geo["paired"].mean == pytest.approx((-0.25 + tilt) / math.log(2), rel=1e-6)   # the gap, in bits per byte
    assert geo["verdict"] == "gpt2.geonorm-normin ahead" and geo["holm"] == pytest.approx(2 * geo["paired"].p)
    assert peri["verdict"] == "undecided" or peri["verdict"].startswith("equivalent")
    part_of = [r16.compare(cells["gpt2.geonorm-normin"], cells["gpt2.pre_ln"], DOCS)]
    r16.family(part_of, declared=2)       # one of a family of two in: ahead whatever the other gives (p to 2p)
    p = part_of[0]["paired"].p
    assert part_of[0]["holm"] is None and part_of[0]["verdict"] == (
        f"gpt2.geonorm-normin ahead (Holm p {p:.2g} to {2 * p:.2g} whatever the other 1 give)")
    assert geo["se_val"] > 0 and geo["pct"] == pytest.approx(100 * geo["paired"].mean / (
        sum(cells["gpt2.pre_ln"].test.values()) / 4), rel=1e-9)
    r16.report(study, runner.args.runs_root, tmp_path / "docs", "horizon16")
    text = (tmp_path / "docs" / "horizon16" / "tables.md").read_text()
    assert "### 16 tokens per parameter (primary horizon)" in text and "### 4 tokens per parameter (secondary" in text
    assert "**Primary family (Holm over these)**" in text and "**Ablation family" in text
    primary = part.pop("primary")  # a part with an ablation family only gets no empty primary table
    r16.report(study, runner.args.runs_root, tmp_path / "abl", "horizon16")
    part["primary"] = primary
    abl_only = (tmp_path / "abl" / "horizon16" / "tables.md").read_text()
    assert "Primary family" not in abl_only and "**Ablation family" in abl_only
    # a family none of whose comparisons has test seeds yet is a sentence, not a table without rows
    assert r16.comparison_table([], "Primary family") == [
        "**Primary family**: none yet (no comparison has its test seeds on both sides).", ""]
    seeds, part["test_seeds"] = part["test_seeds"], [20, 21]   # declared families, none of their test runs yet
    r16.report(study, runner.args.runs_root, tmp_path / "none", "horizon16")
    part["test_seeds"] = seeds
    none_in = (tmp_path / "none" / "horizon16" / "tables.md").read_text()
    assert all(f"**{f} family (Holm over these)**: none yet" in none_in for f in ("Primary", "Ablation"))
    assert "| gpt2.geonorm-normin − gpt2.pre_ln | 4 |" in text
    # every table says how long each run was and which code ran it
    steps = {float(r["tpp"]): (r["steps"], r["tokens"]) for r in rows}
    assert f"Each run: {steps[16.0][0]:,} steps, {steps[16.0][1]:,} tokens." in text
    assert f"Code commits the runs record (each run's is in results.jsonl): {rows[0]['commit']}" in text
    # each trunk records when it ran, so the part's wall time is measured, not estimated
    seg = json.loads(next((runner.args.runs_root / "s").rglob("point.json")).read_text())["segments"]
    assert len(seg) == 1 and seg[0][0] <= seg[0][1]
    assert all(r["segments"] for r in rows) and "h of wall time, the union of the running intervals of the" in text


def test_a_parts_wall_time_counts_each_second_once_over_parallel_jobs_and_resumes():
    from studies.horizon16.report import wall_s

    def row(seed, segments):
        return {"cell": "gpt2.pre_ln", "lr": 3e-3, "mult": 1.0, "seed": seed, "tpp": 16.0, "segments": segments}

    rows = [row(0, [[0, 100]]), row(0, [[0, 100]]),    # one trunk, two horizons' rows: counted once
            row(1, [[50, 120]]),                       # ran beside seed 0: 100-120 is new
            row(2, [[200, 230], [500, 540]]),          # stopped and resumed: the gap between is not counted
            row(3, None)]                              # published before trunks recorded their times
    assert wall_s(rows) == (120 + 30 + 40, 3, 4)
    assert wall_s([row(0, None)]) == (0.0, 0, 1)


def test_a_fresh_checkout_reports_from_the_published_rows(env, tmp_path):
    import shutil

    hz, study, part, runner = env
    hz.run_part(runner, part)
    from studies.horizon16 import report as r16

    docs = tmp_path / "docs"
    r16.report(study, runner.args.runs_root, docs, "horizon16")
    before = (docs / "horizon16" / "tables.md").read_text()
    shutil.rmtree(runner.args.runs_root)
    r16.report(study, runner.args.runs_root, docs, "horizon16")
    assert json.loads((docs / "horizon16" / "val_docs.json").read_text())["bytes"] == DOCS
    assert (docs / "horizon16" / "tables.md").read_text() == before    # the same numbers, s.e. included


def test_test_runs_final_weights_are_kept_in_fp16_and_load_back(tmp_path):
    import torch

    from helpers import gpt_config
    from model import GPT
    from runtime import checkpoint as ck
    from studies.horizon16 import report as r16

    torch.manual_seed(0)
    cfg = gpt_config("pre_ln", n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=257)
    model = GPT(cfg)
    trunk = tmp_path / "runs" / "s" / "gpt2.pre_ln" / "lr0.003" / "s2"
    state = {"step": 16, "model": model.state_dict(), "model_config": cfg.to_dict(), "tokenizer": "bytes",
             "optimizer": {}, "scheduler": {}, "rng": {}, "loader": {}, "config": {}}
    ck.save_checkpoint({**state, "format": ck.FORMAT, "version": ck.VERSION}, trunk / "trunk", 16, keep_last=1)
    row = {"cell": "gpt2.pre_ln", "lr": 3e-3, "mult": 1.0, "seed": 2, "tpp": 16.0, "steps": 16, "commit": "abc",
           "trunk": str(trunk)}
    part = {"name": "p16", "horizons": [16], "primary_horizon": 16}
    selection = {**row, "seed": 0}
    assert r16.keep_weights([row, selection], part, tmp_path / "docs", [2]) == 1   # test seeds only
    f = tmp_path / "docs" / "weights" / "p16" / "gpt2.pre_ln-lr0.003-m1-s2.pt"
    assert r16.keep_weights([row], part, tmp_path / "docs", [2]) == 0              # kept once
    back = r16.load_kept(f)
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict()[k], v.half().float() if v.is_floating_point() else v), k
    assert torch.load(f, weights_only=True)["commit"] == "abc"


def test_test_runs_are_at_the_primary_horizons_choice_only(env, monkeypatch, tmp_path):
    """Where the shorter horizon prefers another lr, no test trunk runs there: its reading comes from the
    primary horizon's test trunks, and the report says at which setting."""
    import sys

    hz, study, part, runner = env
    mod = sys.modules[__name__]
    base = mod.fake
    monkeypatch.setattr(mod, "fake", lambda c, lr, m, s, steps: [  # at 4 steps the best lr is 1.7e-3
        v + 5000 * math.log10(lr / 1.7e-3) ** 2 * (steps == 4) for v in base(c, lr, m, s, steps)])
    hz.run_part(runner, part)
    rows = hz.collect(runner.args.runs_root, part)
    assert hz.best_setting(rows, "gpt2.pre_ln", 4.0, [0, 1])[0] != hz.best_setting(rows, "gpt2.pre_ln", 16.0, [0, 1])[0]
    tested = {(r["lr"], r["mult"]) for r in rows if r["cell"] == "gpt2.pre_ln" and r["seed"] >= 2}
    assert tested == {hz.best_setting(rows, "gpt2.pre_ln", 16.0, [0, 1])}
    from studies.horizon16 import report as r16
    r16.report(study, runner.args.runs_root, tmp_path / "docs", "horizon16")
    assert "### 4 tokens per parameter (secondary reading, at the settings chosen at 16)" in (
        tmp_path / "docs" / "horizon16" / "tables.md").read_text()


def test_an_incomplete_family_settles_what_no_missing_p_can_change():
    """Four of a declared ten in: a comparison whose Holm p stays under 0.05 with every missing p at 1 is ahead; one
    whose Holm p is over 0.05 even with every missing p at 0 (a larger p of the family ranks after it, so its
    multiplier is at least 2) and whose TOST cannot pass is undecided; one the missing can still move is pending;
    one whose TOST passes whatever the rest give is equivalent."""
    from studies.horizon16 import report as r16

    def comp(name, p, p_equiv, mean):
        return {"a": SimpleNamespace(name=name), "b": SimpleNamespace(name="pre_ln"),
                "paired": SimpleNamespace(p=p, p_equiv={r16.BPB_MARGIN: p_equiv}, mean=mean)}

    comps = [comp("siamese", 0.00053, 0.9, -0.17), comp("attnres", 0.041, 0.9, 0.10),
             comp("attnres-b4", 0.051, 0.9, -0.10), comp("frac", 0.013, 0.9, -0.15)]
    r16.family(comps, declared=10)
    verdicts = [c["verdict"] for c in comps]
    assert verdicts[0] == "siamese ahead (Holm p 0.0021 to 0.0053 whatever the other 6 give)"
    assert verdicts[1] == "undecided (Holm p 0.082 to 0.33 whatever the other 6 give)"
    assert verdicts[2] == "undecided (Holm p 0.082 to 0.36 whatever the other 6 give)"
    assert verdicts[3] == "pending: 4 of 10 comparisons in (Holm p 0.039 to 0.12 whatever the other 6 give)"
    # what the bounds rest on: raising any p of a family never lowers another's Holm p
    rng = random.Random(0)
    for _ in range(200):
        ps = [rng.random() ** 3 for _ in range(6)]
        raised = [p if i else min(1.0, p + rng.random() / 4) for i, p in enumerate(ps)]
        assert all(b >= a for a, b in zip(r16.holm(ps)[1:], r16.holm(raised)[1:]))
    same = [comp("a", 0.9, 0.001, 0.001), comp("b", 0.8, 0.04, 0.001)]
    r16.family(same, declared=3)
    assert same[0]["verdict"].startswith(f"equivalent within ±{r16.BPB_MARGIN:g} (TOST Holm p at most 0.003;")
    assert same[1]["verdict"].startswith("pending")   # its TOST p 0.04 times up to 2 may pass 0.05, or may not
