"""The training loop: setup (data, model, optimizer, resume), steps, log/eval/stats/checkpoint events.

Hot path rule: a step queues device work only. Per-step loss and grad norm go into device buffers,
the skipped-step counters and the LR live on the device; the host reads them at log steps only.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from pathlib import Path
from typing import Optional

import torch
from omegaconf import DictConfig

from common import ConfigError, perplexity

from runtime import checkpoint, distributed

from . import faults, resume, run_data, validation
from .config import RunConfig, grad_accum_steps, parse_run_config
from .monitor import (IntervalTimer, Spikes, StatsInputs, block_grad_norms, peak_flops, read_host, stats_values,
                      train_record)
from .optim import LRSchedule, build_optimizer, for_variant
from .prefetch import Prefetcher
from .sinks import Sink, check_wandb_login, open_run_sinks, start_line, summary_record
from .state import TrainerState

log = logging.getLogger("nanonorm.train")


class Trainer(TrainerState):
    def __init__(self, run_cfg: RunConfig, dist: distributed.Runtime, sinks: Optional[list] = None):
        self.run_cfg, self.dist = run_cfg, dist
        self.train_cfg, self.optim_cfg, self.log_cfg = run_cfg.train, run_cfg.optim, run_cfg.logging
        self.extra_sinks = list(sinks or [])
        self.sinks: list[Sink] = []
        self.stop = resume.StopSignal()
        self._was_deterministic = torch.are_deterministic_algorithms_enabled()
        self._was_threads = torch.get_num_threads()
        self._was_flushing = distributed.flushing_denormals()

    # --- setup -----------------------------------------------------------------------------------

    def setup(self) -> None:
        """Everything a run needs before its first step, in order; resumes from a checkpoint if asked."""
        if not self.dist.is_main:  # every rank runs the same code: its warnings would repeat rank 0's
            log.setLevel(logging.ERROR)
        self._configure_torch()
        # Rank 0's resolution of out_dir is the run dir for everyone (robust even to ${now:} in run_name).
        self.run_dir = Path(distributed.broadcast_object(str(self.run_cfg.out_dir)))
        resume_path = self._resolve_resume()
        # before preparing data (hours, for a new tokenizer): a checkpoint of another model or tokenizer is refused now
        resume_ckpt = (
            resume.load_compatible(resume_path, self.run_cfg.model, self.run_cfg.data.tokenizer)
            if resume_path
            else None
        )
        self._prepare_data()
        self._build_model_and_optimizer()
        self.loader, self.val = run_data.loaders(self.data_dir, self.train_cfg, self.model_cfg.block_size, self.accum,
                                                 self.dist)
        self.token_bytes = run_data.token_bytes(self.tokenizer_name, self.device)
        # on CUDA the next micro-batch is gathered and pinned on a thread while the GPU works (trainer/prefetch.py)
        self.batches = (Prefetcher(self.loader, self.accum, pin=True)
                        if self.device.type == "cuda" and not self.train_cfg.overfit_batch else None)
        self._init_run_state()
        config_changed = False
        if resume_ckpt is not None:  # warn about (or refuse) config changes, then load the run's state
            config_changed = resume.check_config_changes(
                resume_path, self.run_cfg.composed, resume_ckpt.get("config") or {}, self.train_cfg.resume_force
            )
            self.load_state_dict(resume_ckpt, resume_path)
        self.branched = resume_path is not None and self.run_dir.resolve() not in resume_path.resolve().parents
        if self.branched:  # another run's checkpoint (a cooldown branch): a run of its own from that step
            self.wandb_run_id, self.train_s_before, config_changed = None, 0.0, False
        self._wrap_model()
        self.flops_per_token = (float(self.model.flops_per_token()), float(self.model.flops_per_token(causal=True)))
        self.peak = peak_flops(self.device, self.precision)
        with distributed.main_step("opening the run's records") as run:
            if run:  # the run dir's config.yaml and the record sinks (trainer/sinks.py)
                self.sinks, self.wandb_run_id = open_run_sinks(
                    self.run_dir, self.run_cfg, self.step, resume_path is not None, config_changed,
                    self.wandb_run_id
                )
                self.sinks.extend(self.extra_sinks)
        self.stop.install()
        if self.dist.is_main and self.log_cfg.console:
            t, m = self.train_cfg, self.model_cfg
            log.info(start_line(self.run_dir, m.norm.name, self.model.num_params(), self.dist.world_size,
                                t.micro_batch_size, m.block_size, self.accum, t.batch_tokens, self.precision,
                                self.use_compile, self.device, resume_path, self.step, self.branched))

    def _configure_torch(self) -> None:
        """Device, precision, threads, determinism and TF32, from train.*."""
        train_cfg = self.train_cfg
        self.device = self.dist.device
        self.precision = self.dist.precision  # train.precision, resolved for the device by the runtime
        if self.precision == "fp16" and self.device.type == "cpu":
            log.warning("fp16 on CPU is slow and only useful for testing the GradScaler path")
        self.autocast = distributed.autocast(self.device, self.precision)
        self.use_compile = (self.device.type == "cuda") if train_cfg.compile == "auto" else train_cfg.compile
        self.fused_loss = (self.device.type == "cuda") if train_cfg.fused_loss == "auto" else train_cfg.fused_loss
        distributed.configure_torch(self.device, train_cfg.threads, train_cfg.deterministic, train_cfg.flush_denormal)

    def _prepare_data(self) -> None:
        self.data_dir, self.tokenizer_name = run_data.prepare(self.run_cfg.data, self.dist)
        self.model_cfg = self.run_cfg.model
        self.accum = grad_accum_steps(self.train_cfg.batch_tokens, self.train_cfg.micro_batch_size,
                                      self.model_cfg.block_size, self.dist.world_size)

    def _build_model_and_optimizer(self) -> None:
        """Model init from `seed` on every rank (DDP also broadcasts rank 0's weights); then per-rank seeds."""
        from model import GPT

        train_cfg = self.train_cfg
        checkpoint.seed_all(train_cfg.seed)
        self.model = GPT(self.model_cfg).to(self.device)
        checkpoint.seed_all(checkpoint.rank_seed(train_cfg.seed, self.dist.rank))
        # what the variant fixes (nGPT: no decay, no warmup): said at start, and recorded in config.yaml
        fixed = for_variant(self.optim_cfg, self.model.variant)
        changed = {k: (getattr(self.optim_cfg, k), getattr(fixed, k)) for k in ("weight_decay", "warmup_steps")
                   if getattr(self.optim_cfg, k) != getattr(fixed, k)}
        if changed:
            if self.dist.is_main:
                log.warning(f"norm={self.model_cfg.norm.name} fixes " + ", ".join(
                    f"optim.{k}={new} (given {old})" for k, (old, new) in changed.items())
                    + ": it trains without them; config.yaml records what runs")
            optim = self.run_cfg.composed.get("optim")
            if isinstance(optim, dict):
                optim.update({k: new for k, (_, new) in changed.items()})
                for g in (optim.get("groups") or {}).values():
                    if isinstance(g, dict) and "weight_decay" in changed and "weight_decay" in g:
                        g["weight_decay"] = changed["weight_decay"][1]
        self.optim_cfg = fixed
        self.opt = build_optimizer(self.model, self.optim_cfg, self.device)
        self.sched = LRSchedule(self.optim_cfg, train_cfg.max_steps)
        # the last update (max_steps - 1) is still inside the warmup
        if self.optim_cfg.warmup_steps >= train_cfg.max_steps:
            log.warning(f"optim.warmup_steps={self.optim_cfg.warmup_steps} >= train.max_steps={train_cfg.max_steps}: "
                        f"the run ends inside the warmup and never reaches the peak optim.lr={self.optim_cfg.lr}")
        self.scaler = torch.amp.GradScaler(self.device.type) if self.precision == "fp16" else None
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.group_params = {g: [p for _, p in named] for g, named in self.model.parameter_groups().items() if named}

    def _init_run_state(self) -> None:
        """Counters, per-step buffers and monitors of a fresh run (a resume then loads them).
        Device-side state is read by the host at log steps only."""
        dev, log_cfg = self.device, self.log_cfg
        self.updates = torch.zeros((), dtype=torch.float64, device=dev)   # applied optimizer updates
        self.skipped = torch.zeros((), dtype=torch.int64, device=dev)     # skipped steps, total
        self.consecutive = torch.zeros((), dtype=torch.int64, device=dev)      # skipped steps in a row
        self.loss_buf = torch.zeros(log_cfg.log_interval, dtype=torch.float32, device=dev)
        self.gn_buf = torch.zeros(log_cfg.log_interval, dtype=torch.float32, device=dev)
        self.spikes = Spikes(log_cfg)
        self.best_val, self.last_val = math.inf, None
        self.final = None  # the final evaluation's validation.ValResult, once made
        self.step, self.wandb_run_id = 0, None
        self.train_s_before = 0.0  # training time of the earlier segments of a resumed run

    def _wrap_model(self) -> None:
        """torch.compile, DDP, and the debugging faults (trainer/faults.py) around the model, once.
        fwd_model: compiled, for evaluation; train_model: what a training micro-step calls."""
        self.fwd_model = torch.compile(self.model) if self.use_compile else self.model
        self.compiling_step = self.use_compile  # the first step compiles: timed apart, reported as compile_s
        self.compile_s = None
        self.ddp = None
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP
            # gradient_as_bucket_view: the grads are views into DDP's all-reduce buckets, not a second copy
            # (~2.6 GB saved at 1.3B parameters in fp16 buckets, more in fp32)
            # No buffer sync before every forward (no_sync micro-steps too): every buffer (RoPE tables, ScaleNorm's
            # fixed radius) is a constant made identically on each rank. Newer torch names it forward_sync_buffers.
            import inspect

            no_sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters
                       else "broadcast_buffers")
            self.ddp = DDP(self.fwd_model, device_ids=[self.dist.local_rank] if self.device.type == "cuda" else None,
                           gradient_as_bucket_view=True, **{no_sync: False})
        self.train_model = faults.wrap_training_forward(self.ddp or self.fwd_model, self.train_cfg,
                                                        step_being_made=lambda: self.step + 1)
        self._flag_group = distributed.new_cpu_group() if self.dist.enabled else None

    def _resolve_resume(self) -> Optional[Path]:
        """Rank 0 claims the run dir and decides (fresh, resume from which file, or error: trainer/resume.py);
        it tells the other ranks."""
        decision = None
        with distributed.main_step("claiming the run dir") as run:
            if run:
                self.lock, error = resume.claim_run_dir(self.run_dir)
                decision = ("error", error) if error else resume.decide(self.train_cfg, self.run_dir)
        decision = distributed.broadcast_object(decision)
        if decision[0] == "error":
            raise ConfigError(decision[1])
        return Path(decision[1]) if decision[1] else None

    def emit(self, record: dict) -> None:
        for s in self.sinks:
            s.log(record)

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> dict:
        train_cfg, log_cfg = self.train_cfg, self.log_cfg
        result = {"run_dir": str(self.run_dir), "stopped": None, "diverged": False}
        if self.step >= train_cfg.max_steps and self.step > 0:  # nothing to train: its records stay as they are
            if self.dist.is_main:
                log.warning(f"run {self.run_dir} is already complete (step {self.step}, train.max_steps="
                            f"{train_cfg.max_steps}); nothing trained and nothing rewritten; to train further, pass a "
                            "larger train.max_steps with train.resume=auto")
            result["steps"] = self.step
            return result
        if self.step == 0:
            self.evaluate()
            x, y = (t.to(self.device) for t in self.loader.get_batch(0, 0))  # step 1's first micro-batch
            self.log_stats(0, StatsInputs(x, y, {}, {}))  # the geometry at init, before any update
        self._wall0, self._step0 = time.perf_counter(), self.step  # for the ETA and the final summary
        timer = IntervalTimer(sync=self._device_sync())
        n_buf = 0
        while self.step < train_cfg.max_steps:
            s = self.step + 1  # the step being made; records use completed-step counts
            is_stats = s % log_cfg.stats_interval == 0
            # a compiling first step is timed apart and reported as compile_s
            stats_inputs, compile_s = timer.step(lambda: self.train_step(s, is_stats, n_buf), apart=self.compiling_step)
            if compile_s is not None:
                self.compile_s, self.compiling_step = compile_s, False
            self.step, n_buf = s, n_buf + 1
            self.stop.note(s)
            last = s == train_cfg.max_steps
            is_ckpt = (s % train_cfg.ckpt_interval == 0 or last or s in train_cfg.ckpt_steps
                       or (train_cfg.stop_at is not None and s >= train_cfg.stop_at))
            if is_stats:
                with timer.exclude():
                    self.log_stats(s, stats_inputs)
            # Log steps: every log_interval, plus before any checkpoint (so a resumed run logs identically),
            # plus the step at which a stop signal is acted on (this step alone, the next one under DDP).
            signalled = self.stop.requested(self._flag_group)
            if s % log_cfg.log_interval == 0 or is_ckpt or n_buf == log_cfg.log_interval or signalled:
                signal_seen, consecutive = self.log_train(s, n_buf, *timer.read())
                n_buf = 0
                timer.start()
                if consecutive >= train_cfg.max_skipped:
                    self._stop_diverged(s, consecutive, result)
                    break
                if signal_seen:
                    self._stop_signalled(s, signal_seen, result)
                    return self._finish(result, summary=False)
            is_eval = s % train_cfg.eval_interval == 0 or last
            if is_eval or is_ckpt:  # excluded from the interval's time; its syncs only where it runs
                with timer.exclude():
                    if is_eval:
                        self.evaluate()
                    if last:
                        self.evaluate_final()
                    if is_ckpt:
                        result["checkpoint"] = str(self.save())
                if is_ckpt and train_cfg.stop_at is not None and s >= train_cfg.stop_at and not last:
                    result["stopped"] = "stop_at"
                    return self._finish(result, summary=False)
        return self._finish(result, summary=True)

    def _device_sync(self):
        """What the interval timer waits on at the ends of an excluded region and of an interval: the device's
        queue on CUDA; nothing on the CPU, which runs the step synchronously."""
        dev = self.device
        return (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None

    def _stop_diverged(self, s: int, consecutive: int, result: dict) -> None:
        """Too many non-finite steps in a row: evaluate, checkpoint, and end the run as diverged."""
        result["diverged"] = True
        msg = resume.diverged_message(s, consecutive, self.train_cfg.max_skipped, self.log_cfg.log_interval)
        if self.dist.is_main:  # every rank stops with the same message: say it once
            log.error(msg)
        result["message"] = msg
        self.evaluate()
        result["checkpoint"] = str(self.save())

    def _stop_signalled(self, s: int, signal_seen: str, result: dict) -> None:
        """A pre-emption signal: checkpoint at this step boundary, to be resumed."""
        result["stopped"] = signal_seen
        result["checkpoint"] = str(self.save())
        at = f" at step {self.stop.step}" if self.stop.step is not None else ""
        log.warning(f"{signal_seen} received{at}: checkpoint saved at step {s}; continue with train.resume=auto")

    def train_step(self, s: int, is_stats: bool, slot: int) -> Optional[StatsInputs]:
        """Step `s`: forward/backward over the micro-batches, clip, update or skip a non-finite step.
        Its loss and grad norm go to the device buffers at `slot`. Returns, at a stats step
        (`is_stats`), what log_stats needs from it; None otherwise."""
        dev = self.device
        self.opt.set_lr(self.sched(self.updates))
        batch_index = 0 if self.train_cfg.overfit_batch else s - 1
        loss_sum = torch.zeros((), device=dev)
        for micro in range(self.accum):
            if self.batches is not None:  # CUDA: prefetched, pinned
                x, y = (t.to(dev, non_blocking=True) for t in self.batches.get(batch_index, micro))
            else:
                x, y = self.loader.get_batch(batch_index, micro)
                if dev.type == "cuda":
                    x, y = x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)
            # DDP: all-reduce gradients on the last micro-step only.
            sync = self.ddp is None or micro == self.accum - 1
            with (contextlib.nullcontext() if sync else self.ddp.no_sync()):
                with self.autocast():
                    _, loss = self.train_model(x, y, return_logits=not self.fused_loss)
                loss_sum += loss.detach().float()
                scaled = loss / self.accum
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        if self.scaler is not None:
            self.scaler.unscale_(self.opt.inner)
        stats_inputs = StatsInputs(x, y, block_grad_norms(self.model.block_modules()), {}) if is_stats else None
        before = ({g: [p.detach().clone() for p in ps] for g, ps in self.group_params.items()}
                  if is_stats else None)  # a copy of the weights at stats steps only, for ||dW||/||W||
        grads = [p.grad for p in self.params if p.grad is not None]
        gn = torch.nn.utils.get_total_norm(grads, foreach=True)
        if self.optim_cfg.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.optim_cfg.grad_clip, gn, foreach=True)
        # Gradients are all-reduced, so `bad` agrees on every rank: all ranks skip together.
        bad = ~torch.isfinite(gn)
        self.opt.step(bad, self.scaler)  # skipped where bad, on the device where the optimizer allows
        self.model.after_optimizer_step(~bad)  # the variant's post-step hook; a no-op unless applied
        if before is not None:
            from model.geometry import update_ratios
            stats_inputs.update_ratios.update(update_ratios(before, self.group_params))
        self.opt.zero_grad(set_to_none=True)
        self.updates += (~bad).double()
        self.skipped += bad.long()
        self.consecutive.copy_(torch.where(bad, self.consecutive + 1, torch.zeros_like(self.consecutive)))
        self.loss_buf[slot] = loss_sum / self.accum
        self.gn_buf[slot] = gn.float()
        return stats_inputs

    # --- events ----------------------------------------------------------------------------------

    def log_train(self, s: int, n: int, elapsed: float, timed: int):
        """Read the device buffers (the per-interval host sync), reduce over ranks, detect spikes, emit.

        `elapsed` is the time of the interval's `timed` steps (all n but a compiling first step);
        throughput and MFU are null when no step was timed."""
        W, bt = self.dist.world_size, self.train_cfg.batch_tokens
        loss_mean = distributed.all_reduce_(self.loss_buf[:n].clone(), "sum") / W
        flag = torch.tensor([self.stop.log_flag()], device=self.device)
        # loss maxima, any rank's signal and the longest run of skipped steps: every rank decides to stop (and
        # enters the eval and save collectives) on the same reduced values, never on its own counter alone
        mx = distributed.all_reduce_(torch.cat([self.loss_buf[:n], flag, self.consecutive.float().reshape(1)]), "max")
        h = read_host(loss=loss_mean, loss_max=mx[:n], flag=mx[n:n + 1], grad_norm=self.gn_buf[:n],
                      skipped=self.skipped, consecutive=mx[n + 1:], lr=self.opt.lr)  # the interval's one host sync
        for spike in self.spikes.update(s - n + 1, bt, loss=h["loss"], grad_norm=h["grad_norm"]):
            if self.dist.is_main:
                self.emit(spike)
        rec = train_record(s, bt, h, elapsed, timed, W, self.flops_per_token, self.peak, self.spikes.counts())
        signal_seen, consecutive = self.stop.adopt_log_flag(h["flag"][0]), int(h["consecutive"][0])
        if self.compile_s is not None:  # once, in the first record after the compiling step
            rec["compile_s"], self.compile_s = self.compile_s, None
        if self.dist.is_main:
            self.emit(rec)
        return (self.stop.received or "SIGTERM/SIGUSR1 (on another rank)") if signal_seen else None, consecutive

    def evaluate(self) -> None:
        """The validation loss and bits per byte on train.eval_tokens spread over the split, over every rank."""
        r = validation.score(self.fwd_model, self.val, self.autocast, self.device, self.token_bytes)
        val = self.last_val = r.loss
        if math.isfinite(val):
            self.best_val = min(self.best_val, val)
        if self.dist.is_main:
            self.emit({"kind": "eval", "step": self.step, "tokens": self.step * self.train_cfg.batch_tokens,
                       "val_loss": val, "val_bpb": r.bpb, "val_ppl": perplexity(val)})

    def evaluate_final(self) -> None:
        """The run's final evaluation: train.final_eval_tokens spread over the split (null: the whole split),
        with each document's nats, bytes and tokens kept in <run dir>/final_eval.json. The summary's final
        loss is this one."""
        loader = run_data.final_loader(self.data_dir, self.train_cfg, self.model_cfg.block_size, self.dist)
        r = self.final = validation.score(self.fwd_model, loader, self.autocast, self.device, self.token_bytes)
        if not self.dist.is_main:
            return
        rec = {"kind": "final_eval", "step": self.step, "tokens": self.step * self.train_cfg.batch_tokens,
               "val_loss": r.loss, "val_bpb": r.bpb, "val_ppl": perplexity(r.loss), "se_bpb": r.se_bpb(),
               "val_tokens": r.tokens, "val_bytes": r.bytes, "val_docs": int((r.doc_tokens > 0).sum()),
               "whole_split": loader.whole}
        validation.write_final(self.run_dir / "final_eval.json", rec, r)
        self.emit(rec)

    @torch.no_grad()
    def log_stats(self, s: int, inputs: StatsInputs) -> None:
        """At step 0 and every stats_interval: the stream's geometry (model/geometry.py: residual RMS,
        effective angle, relative update, ||F||/||h|| and ||dL/dh|| per sublayer, from an extra eval-mode
        forward and backward of the step's last micro-batch, rank 0's view), per-block grad norms and
        per-group ||dW||/||W|| of step s, and the sphere family's norm_stats()."""
        if self.dist.is_main:  # the eager, unwrapped model: return_hidden must not trigger recompiles
            values = stats_values(self.model, inputs.x, inputs.y, self.autocast,
                                  {**inputs.block_grad_norms, **inputs.update_ratios})
            self.emit({"kind": "stats", "step": s, "tokens": s * self.train_cfg.batch_tokens, **values})

    def save(self) -> Optional[Path]:
        rng = distributed.gather_objects(checkpoint.rng_state())  # every rank's streams, for an exact resume
        path = None
        if self.dist.is_main:
            path = checkpoint.save_checkpoint(
                self.state_dict(rng), self.run_dir, self.step, self.train_cfg.keep_last, self.train_cfg.ckpt_steps
            )
            if self.log_cfg.console:
                log.info(f"saved {path}")
        distributed.barrier()
        return path

    def _finish(self, result: dict, summary: bool) -> dict:
        result["steps"] = self.step
        if summary and self.dist.is_main:
            rec = summary_record(self.step, self.train_cfg.batch_tokens, self.last_val, self.best_val, self.final,
                                 self.spikes.counts(), int(self.skipped.item()), result["diverged"],
                                 self.model_cfg.norm.name, self.train_cfg.seed,
                                 wall_s=time.perf_counter() - self._wall0, train_s=self._train_s())
            self.emit(rec)
            result["summary"] = rec
        return result

    def _train_s(self) -> float:
        """Seconds of training over every segment of this run: the earlier ones (as their last checkpoint
        recorded) plus this process's so far."""
        return self.train_s_before + time.perf_counter() - getattr(self, "_wall0", time.perf_counter())

    def close(self) -> None:
        if getattr(self, "batches", None) is not None:
            self.batches.close()
        self.stop.uninstall()
        if getattr(self, "lock", None) is not None:
            self.lock.release()
        torch.use_deterministic_algorithms(self._was_deterministic)  # in-process callers (tests) get theirs back
        torch.set_num_threads(self._was_threads)
        torch.set_flush_denormal(self._was_flushing)  # this thread's; threads torch started in the run keep it
        for s in self.sinks:
            s.close()


def train(cfg: DictConfig, sinks: Optional[list] = None) -> dict:
    """Run one training job from a composed Hydra config. Returns a result dict (summary, checkpoint)."""
    run_cfg = parse_run_config(cfg)  # validate everything before touching devices or data
    check_wandb_login(run_cfg.logging.wandb)
    trainer = Trainer(run_cfg, distributed.init_distributed(run_cfg.train.device, precision=run_cfg.train.precision),
                      sinks)
    try:
        trainer.setup()
        return trainer.run()
    finally:
        trainer.close()
        distributed.teardown()
