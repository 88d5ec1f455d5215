"""scripts/gpu_check.sh and gpu_check.py (its checks: experiments/gpu_checks.py) as far as a CPU can run them:
the same checks, small."""
import importlib.util
import os
import re
import subprocess
from types import SimpleNamespace

import pytest

from helpers import REPO


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.usefixtures("pydocs")  # the train_loop check reads the prepared corpus ($NANONORM_DATA)
def test_gpu_check_runs_every_check_on_cpu_and_prints_a_table():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(["bash", "scripts/gpu_check.sh", "--device", "cpu", "--variants", "geonorm"], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    table = [s for s in p.stdout.splitlines() if s.startswith("| ")]
    rows = {s.split("|")[1].strip(): s.split("|")[2].strip() for s in table[1:]}
    smoke = "smoke/" + mod_paper_experiments()[0]
    assert rows == {
        "compile/geonorm": "PASS",
        "neox/geonorm": "PASS",
        "fused_adamw_skip": "PASS",
        "train_loop/bf16": "PASS",
        "train_loop/fp16": "PASS",
        "nccl_2proc": "SKIP",
        "ddp_accum_resume": "SKIP",
        "throughput": "PASS",
        "family/classic": "PASS",  # --variants geonorm keeps its family's row and Pre-LN's, the ratios' base
        "family/geodesic": "PASS",
        "memory/tiny/pre_ln": "PASS",
        "memory/tiny/geonorm": "PASS",
        smoke: "PASS",
    }, p.stdout
    assert "GradScaler at 32768" in p.stdout  # the fp16 loop's NaN step backed the scale off from 2**16
    assert re.search(r"checks in \d+ s, \d+ graph\(s\) compiled in this process: no failures", p.stdout)


def mod_paper_experiments():
    from experiments.gpu_checks import paper_experiments

    return paper_experiments()


def test_gpu_check_exits_nonzero_on_a_failed_or_crashed_check(capsys):
    mod = _module()

    def failing(ctx, args):
        yield "fake/fails", "FAIL", "loss diff too large", 0.0

    def crashing(ctx, args):
        yield "fake/passes", "PASS", "fine", 0.0
        raise RuntimeError("CUDA error: an illegal memory access")

    mod.CHECKS = {"failing": failing, "crashing": crashing, "fused_skip": mod.CHECKS["fused_skip"]}
    assert mod.main(["--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "| fake/fails       | FAIL   |" in out and "| crashing         | FAIL   |" in out
    assert "RuntimeError: CUDA error: an illegal memory access" in out
    assert "| fused_adamw_skip | PASS   |" in out  # the checks after a crash still run
    assert "2 FAILED (fake/fails, crashing)" in out
    assert mod.main(["--device", "cpu", "--only", "fused_skip"]) == 0
    assert mod.main(["--device", "cpu", "--only", "nope"]) == 2
    if not __import__("torch").cuda.is_available():
        assert mod.main([]) == 2 and "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("check", ["memory", "families"])
def test_a_memory_row_frees_its_model_before_the_next_row_measures(monkeypatch, check):
    """A loss (or logits) kept past its row holds the autograd graph, and through it the weights and grads
    of that model: the next row's peak then counted them (seen on a GPU). No weight of a row survives it."""
    import weakref

    from experiments import gpu_checks

    made, real_gpt = [], gpu_checks.GPT

    def tracked_gpt(cfg):
        model = real_gpt(cfg)
        made.append([weakref.ref(p) for p in model.parameters()])
        return model

    monkeypatch.setattr(gpu_checks, "GPT", tracked_gpt)
    rows = 0
    args = SimpleNamespace(variants=None)
    for name, status, _, _ in getattr(gpu_checks, f"check_{check}")(gpu_checks.Ctx("cpu"), args):
        assert status == "PASS", name
        assert not any(w() is not None for w in made[-1]), f"{name}: its weights outlive the row"
        rows += 1
    assert rows == len(made) >= 2
