"""The sweep as a launcher of real processes: points packed one per GPU slot, a SIGTERM/SIGINT forwarded to
the running points and waited for, no point outliving a killed sweep, and the Slurm array's pre-emption
requeue. The points are a stand-in for train.py (a shell script given as --python) that records what it saw."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.children import GpuSlots

REPO = Path(__file__).resolve().parent.parent

FAKE = """#!/bin/bash
# stands in for `python train.py ...`: records its pid and CUDA_VISIBLE_DEVICES, runs until told to stop.
# The trap goes first: "start" means a signal from now on is recorded (before it, bash would let a SIGINT
# that arrives during $(date) pass and run its full time, and the sweep would wait for it).
trap 'echo "$$ ${CUDA_VISIBLE_DEVICES:-none} $(date +%s.%N) term" >> "$FAKE_DIR/log"; exit 0' TERM INT
echo "$$ ${CUDA_VISIBLE_DEVICES:-none} $(date +%s.%N) start" >> "$FAKE_DIR/log"
end=$(( $(date +%s) + ${FAKE_SECONDS:-60} ))
while [ "$(date +%s)" -lt $end ]; do sleep 0.05; done
echo "$$ ${CUDA_VISIBLE_DEVICES:-none} $(date +%s.%N) end" >> "$FAKE_DIR/log"
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    script = tmp_path / "fake_python"
    script.write_text(FAKE)
    script.chmod(0o755)
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    return script


def events(tmp_path) -> list[tuple[int, str, float, str]]:
    log = tmp_path / "log"
    out = []
    for line in (log.read_text().splitlines() if log.is_file() else []):
        pid, dev, t, what = line.split()
        out.append((int(pid), dev, float(t), what))
    return out


def sweep_cmd(fake, root, *extra) -> list[str]:
    return [sys.executable, str(REPO / "scripts" / "sweep.py"), "--name", "t", "--variants", "pre_ln",
            "--python", str(fake), "--runs-root", str(root), *extra, "--", "model=tiny", "train.max_steps=2"]


def wait_for(cond, timeout=60.0):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            raise AssertionError("timed out")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Running (a zombie nobody has reaped yet, e.g. under a container's init, has stopped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_sweep_reaches_each_running_point_once_and_starts_nothing_more(tmp_path, fake, sig):
    proc = subprocess.Popen(sweep_cmd(fake, tmp_path / "runs", "--seeds", "0,1,2", "--jobs", "2"), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: sum(e[3] == "start" for e in events(tmp_path)) == 2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    ev = events(tmp_path)
    started = {e[0] for e in ev if e[3] == "start"}
    assert proc.returncode == 128 + sig, err
    assert len(started) == 2 and sorted(e[0] for e in ev if e[3] == "term") == sorted(started)   # once each
    assert f"{signal.Signals(sig).name}: told 2 running train.py to checkpoint and stop" in err
    assert "Traceback" not in err and not any(alive(p) for p in started)


@pytest.mark.slow
def test_a_killed_sweep_takes_its_points_with_it(tmp_path, fake):
    proc = subprocess.Popen(sweep_cmd(fake, tmp_path / "runs", "--seeds", "0,1", "--jobs", "2"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: sum(e[3] == "start" for e in events(tmp_path)) == 2)
    proc.kill()
    proc.wait()
    wait_for(lambda: sum(e[3] == "term" for e in events(tmp_path)) == 2, timeout=20)   # SIGTERM, so they save
    wait_for(lambda: not any(alive(e[0]) for e in events(tmp_path)), timeout=20)


@pytest.mark.slow
def test_points_are_packed_one_per_gpu_and_never_share_one(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_SECONDS", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    r = subprocess.run(sweep_cmd(fake, tmp_path / "runs", "--seeds", "0,1,2,3", "--jobs", "2"), cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ev = events(tmp_path)
    spans = {}
    for pid, dev, t, what in ev:
        spans.setdefault(pid, {"dev": dev})[what] = t
    assert len(spans) == 4 and {s["dev"] for s in spans.values()} == {"3", "5"}
    for a in spans.values():            # two points running at once are on different GPUs
        for b in spans.values():
            if a is not b and a["start"] < b["start"] < a["end"]:
                assert a["dev"] != b["dev"]
    assert "on CUDA_VISIBLE_DEVICES=3" in r.stdout and "on CUDA_VISIBLE_DEVICES=5" in r.stdout
    # more jobs than GPUs: refused before anything runs, unless asked
    r = subprocess.run(sweep_cmd(fake, tmp_path / "runs2", "--seeds", "0,1,2", "--jobs", "3", "--gpus", "0,1"),
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip().endswith(
        "--jobs 3: 2 visible GPU(s) (0,1) hold 2 run(s) of 1 GPU(s) at once: lower --jobs to 2, name the GPUs with "
        "--gpus, or pass --oversubscribe to share them")
    assert not (tmp_path / "runs2").exists()


def test_gpu_slots_give_each_multi_gpu_point_its_own_devices():
    slots = GpuSlots(["0", "1", "2", "3"], per_run=2, jobs=2)
    (a, env_a), (_, env_b) = slots.acquire(), slots.acquire()
    assert {env_a["CUDA_VISIBLE_DEVICES"], env_b["CUDA_VISIBLE_DEVICES"]} == {"0,1", "2,3"}
    slots.release(a)
    assert slots.acquire()[1]["CUDA_VISIBLE_DEVICES"] == env_a["CUDA_VISIBLE_DEVICES"]
    with pytest.raises(SystemExit, match="a run needs 8 GPUs, 4 visible"):
        GpuSlots(["0", "1", "2", "3"], per_run=8, jobs=1)
    over = GpuSlots(["0"], per_run=1, jobs=3, oversubscribe=True)
    assert [over.acquire()[1]["CUDA_VISIBLE_DEVICES"] for _ in range(3)] == ["0", "0", "0"]
    assert GpuSlots([], per_run=1, jobs=4).acquire()[1] is None          # CPU: the environment as it is


@pytest.mark.slow
def test_the_slurm_array_requeues_a_pre_empted_point_and_skips_a_finished_one(tmp_path, fake):
    root = tmp_path / "runs"
    r = subprocess.run(sweep_cmd(fake, root, "--seeds", "0", "--slurm"), cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    script = (root / "t" / "sweep.sbatch").read_text()
    assert "#SBATCH --signal=USR1@120" in script and "#SBATCH --requeue" in script
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text('#!/bin/bash\necho srun >> "$FAKE_DIR/calls"\n'
                               'while [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    (bin_ / "scontrol").write_text('#!/bin/bash\necho "scontrol $*" >> "$FAKE_DIR/calls"\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": "0",
           "SLURM_ARRAY_JOB_ID": "77", "FAKE_SECONDS": "0"}
    # the point exits 0 without a summary line: pre-empted, so the task requeues itself
    r = subprocess.run(["bash", str(root / "t" / "sweep.sbatch")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "calls").read_text().splitlines() == ["srun", "scontrol requeue 77_0"]
    point_dir = root / "t" / "pre_ln-s0"
    assert str(point_dir / "metrics.jsonl") in script
    point_dir.mkdir(parents=True, exist_ok=True)
    (point_dir / "metrics.jsonl").write_text(json.dumps({"kind": "summary", "step": 2}) + "\n")
    r = subprocess.run(["bash", str(root / "t" / "sweep.sbatch")], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "point finished already" in r.stdout
    assert (tmp_path / "calls").read_text().splitlines() == ["srun", "scontrol requeue 77_0"]   # nothing new


def test_a_grid_value_given_twice_in_two_spellings_is_refused(load_script):
    sweep = load_script("sweep")
    with pytest.raises(SystemExit, match=r"--grid 'optim.lr=1e-3,0.001': 1e-3 and 0.001 are the same value"):
        sweep.main(["--name", "t", "--grid", "optim.lr=1e-3,0.001", "--dry-run", "--", "model=tiny"])
    with pytest.raises(SystemExit, match="norm=pre_ln,pre_ln"):
        sweep.main(["--name", "t", "--grid", "norm=pre_ln,pre_ln", "--dry-run"])


def test_study_list_refuses_an_unknown_experiment_or_norm(load_script):
    load_script("sweep")
    study = load_script("study")
    with pytest.raises(SystemExit, match=r"--experiment nope: no configs/experiment/nope.yaml; valid: .*fidelity"):
        study.main(["horizon", "--experiment", "nope", "--list"])
    with pytest.raises(SystemExit, match=r"^horizon: unknown norm=nope: valid are .*pre_ln"):
        study.main(["horizon", "--list", "--", "norm=nope"])
    assert study.main(["horizon", "--list"]) == 0


def test_make_table_best_over_a_key_no_run_has_is_refused(tmp_path, load_script):
    make_table = load_script("make_table")
    d = tmp_path / "sw" / "a"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("norm: {name: pre_ln}\noptim: {lr: 0.003}\ntrain: {seed: 0}\n")
    (d / "metrics.jsonl").write_text(json.dumps({"kind": "summary", "step": 4, "tokens": 8, "final_val_loss": 2.5,
                                                 "diverged": False}) + "\n")
    with pytest.raises(SystemExit, match=r"--best-over nokey.x: no run's config.yaml has that key"):
        make_table.main([str(tmp_path / "sw"), "--best-over", "nokey.x"])
    assert make_table.main([str(tmp_path / "sw"), "--best-over", "optim.lr"]) == 0
    # a --group-by key no run has used to label every row (key=None); --out at a directory wrote <dir>.md
    with pytest.raises(SystemExit, match=r"--group-by nope.key: no run's config.yaml has that key"):
        make_table.main([str(tmp_path / "sw"), "--group-by", "nope.key"])
    with pytest.raises(SystemExit, match=r"--out .* is a directory: give a file name"):
        make_table.main([str(tmp_path / "sw"), "--out", str(tmp_path)])
    assert not (tmp_path.parent / f"{tmp_path.name}.md").exists()


def test_an_empty_points_file_is_refused(tmp_path, load_script):
    """It used to plan '0 points' and exit 0."""
    sweep = load_script("sweep")
    empty = tmp_path / "points.yaml"
    empty.write_text("")
    with pytest.raises(SystemExit, match=r"--points .*points.yaml: no points \(the file is empty\)"):
        sweep.main(["--points", str(empty), "--name", "t", "--runs-root", str(tmp_path), "--dry-run"])


def test_data_preparation_uses_the_jobs_cores_and_spawns_once_a_process_group_is_up(monkeypatch):
    import data.prepare as prep
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert prep.allocated_cpus() == 3                      # the allocation, not the node's cores
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5})
    assert prep.allocated_cpus() == 2
    assert prep.start_method() == "fork"
    monkeypatch.setattr("torch.distributed.is_initialized", lambda: True)
    assert prep.start_method() == "spawn"


def test_a_failed_point_says_why_and_where_its_log_is(tmp_path):
    script = tmp_path / "failing_python"
    script.write_text("#!/bin/bash\necho 'some progress'\necho 'error: data.files: no file matches x' >&2\nexit 2\n")
    script.chmod(0o755)
    root = tmp_path / "runs"
    p = subprocess.run(sweep_cmd(script, root, "--jobs", "2"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    log = root / "t" / "pre_ln-s0" / "sweep.log"
    assert f"pre_ln-s0: failed (exit 2): error: data.files: no file matches x (log {log})" in p.stdout, p.stdout


def test_what_every_point_shares_is_checked_once_before_anything_starts(tmp_path):
    """A data glob that matches nothing used to launch six points that each failed on it."""
    root = tmp_path / "runs"
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "sweep.py"), "--experiment", "geonorm_125m_books3_512",
                        "--jobs", "8", "--runs-root", str(root), "--", f"data.files={tmp_path}/books3/*.jsonl",
                        f"data.root={tmp_path}/data"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == (
        f"error: all 6 point(s) to run share this problem, nothing started: data.files: no file matches "
        f"'{tmp_path}/books3/*.jsonl'"), p.stderr[-2000:]
    assert not root.exists() or not any(root.rglob("sweep.log"))


def test_a_point_that_stops_early_is_not_reported_done(tmp_path):
    """train.py stopped by a signal checkpoints and exits 0: the sweep used to call it 'done'."""
    script = tmp_path / "py"
    # the stand-in ends its run (a summary line) only when FINISH is set; else it exits 0, as a stopped run does
    script.write_text('#!/bin/bash\nfor a in "$@"; do case "$a" in out_dir=*) d="${a#out_dir=}";; esac; done\n'
                      'mkdir -p "$d"; echo \'{"kind": "train", "step": 1, "tokens": 1}\' > "$d/metrics.jsonl"\n'
                      '[ -n "$FINISH" ] && echo \'{"kind": "summary", "step": 2, "tokens": 2}\' >> "$d/metrics.jsonl"\n'
                      'exit 0\n')
    script.chmod(0o755)
    p = subprocess.run(sweep_cmd(script, tmp_path / "runs", "--jobs", "2"), capture_output=True, text=True, timeout=120)
    assert "pre_ln-s0: stopped before its end (checkpointed; rerun the same command to resume)" in p.stdout, p.stdout
    p = subprocess.run(sweep_cmd(script, tmp_path / "runs2", "--jobs", "2"), capture_output=True, text=True,
                       timeout=120, env={**os.environ, "FINISH": "1"})
    assert "pre_ln-s0: done" in p.stdout, p.stdout
