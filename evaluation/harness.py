"""lm-evaluation-harness adapter: our GPT as an `lm_eval` LM, and a per-task runner.

TemplateLM (an `lm_eval.api.model.LM`) does the harness's standard request tokenization (trailing
context spaces move to the continuation, the pair is encoded whole then split, an empty context
becomes the end-of-text token); we score the resulting tokens with the windows of scoring.py, so a
continuation longer than the context is scored in full-context chunks instead of being cut.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from lm_eval.api.model import TemplateLM
from tqdm import tqdm

from model.generate import generate

from runtime.distributed import Runtime
from .scoring import plan_windows, score_batch

class NanoLM(TemplateLM):
    """Adapter: loglikelihood / loglikelihood_rolling / generate_until, batched, for one GPT + tokenizer."""

    def __init__(self, model, tokenizer, batch_size: int = 8, max_gen_toks: int = 256,
                 rt: Optional[Runtime] = None, seed: int = 1234):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)
        self.max_gen_toks = int(max_gen_toks)
        self.rt = rt or Runtime(next(model.parameters()).device)
        self._rank, self._world_size, self._device = self.rt.rank, self.rt.world_size, self.rt.device
        self.seed = seed

    # --- tokenization (TemplateLM's hooks) ---
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eot

    @property
    def max_length(self) -> int:
        return self.model.config.block_size

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string)

    def tok_decode(self, tokens) -> str:
        return self.tokenizer.decode(tokens)

    # --- scoring ---
    def _score(self, seqs: list[tuple[list[int], int]], desc: str, disable_tqdm: bool) -> list[tuple[float, bool]]:
        """(tokens, first scored index) per request -> (sum log-prob, all greedy) per request.

        Windows of all requests are sorted longest first so batches pad little and an out-of-memory
        batch size shows up at once."""
        items = [(i, w) for i, (tok, first) in enumerate(seqs)
                 for w in plan_windows(len(tok), first, self.max_length, self.max_length)]
        items.sort(key=lambda it: -(it[1].end - it[1].start))
        lp_sum = [0.0] * len(seqs)
        greedy = [True] * len(seqs)
        bar = tqdm(total=len(items), desc=desc, disable=disable_tqdm or self.rank != 0)
        for b in range(0, len(items), self.batch_size):
            chunk = items[b:b + self.batch_size]
            lp, gr, _ = score_batch(self.model, [(seqs[i][0], w) for i, w in chunk], self.device, self.rt.autocast())
            for (i, _), logp, g in zip(chunk, lp.tolist(), gr.tolist()):
                lp_sum[i] += logp
                greedy[i] = greedy[i] and g
            bar.update(len(chunk))
        bar.close()
        return list(zip(lp_sum, greedy))

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        seqs = [(ctx + cont, len(ctx)) for _, ctx, cont in requests]
        out = self._score(seqs, "loglikelihood", disable_tqdm)
        for (key, _, _), res in zip(requests, out):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Whole-text log-likelihood, conditioned on end-of-text; texts longer than block_size are
        scored in disjoint chunks, each with full context (the harness's rolling windows)."""
        seqs = [([self.eot_token_id] + self.tok_encode(text), 1) for (text,) in (r.args for r in requests)]
        out = [lp for lp, _ in self._score(seqs, "loglikelihood_rolling", disable_tqdm)]
        for r, lp in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, lp)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """One request at a time with the KV cache (the model takes no padding mask, so prompts of
        different lengths cannot share a batch). Greedy unless the task asks for do_sample."""
        out = []
        gen = torch.Generator(device=self.device).manual_seed(self.seed)
        for r in tqdm(requests, desc="generate_until", disable=disable_tqdm or self.rank != 0):
            context, kw = r.args
            kw = dict(kw or {})
            until = kw.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            eot_str = self.tok_decode([self.eot_token_id])
            if eot_str not in until:
                until.append(eot_str)
            max_new = int(kw.pop("max_gen_toks", self.max_gen_toks))
            temperature = float(kw.pop("temperature", 0.0)) if kw.pop("do_sample", False) else 0.0
            ctx = self.tok_encode(context) or [self.eot_token_id]
            # as the harness's HF model does: leave room for the generation inside the context
            ctx = ctx[-max(1, self.max_length - max_new):]
            idx = torch.tensor([ctx], dtype=torch.long, device=self.device)

            def stop(seq: torch.Tensor) -> bool:
                text = self.tok_decode(seq[0, len(ctx):].tolist())
                return any(u in text for u in until)

            with self.rt.autocast():
                seq = generate(self.model, idx, max_new, temperature=temperature, top_k=kw.get("top_k"),
                               top_p=kw.get("top_p"), generator=gen, vocab_size=self.tokenizer.vocab_size,
                               cache_dtype=self.rt.cache_dtype, stop=stop)
            text = self.tok_decode(seq[0, len(ctx):].tolist())
            for u in until:
                text = text.split(u)[0]
            self.cache_hook.add_partial("generate_until", r.args, text)
            out.append(text)
        return out

    # --- torch.distributed primitives the evaluator uses under torchrun ---
    # Each first checks that no rank has failed the task (see run_tasks): a rank whose task raised
    # has left the evaluator, so a collective issued without that check would wait for it forever.
    def agree(self, error: Optional[str] = None) -> Optional[str]:
        """Exchange every rank's error for the current task (None: fine); the first one, or None.

        On the gloo group with the long timeout: ranks reach this at different times (one may
        still be downloading a dataset)."""
        if self.world_size <= 1:
            return error
        from runtime.distributed import wait_group

        errors = [None] * self.world_size
        dist.all_gather_object(errors, error, group=wait_group())
        return next((f"rank {r}: {e}" for r, e in enumerate(errors) if e is not None), None)

    def _all_ranks_ok(self) -> None:
        failed = self.agree(None)
        if failed is not None:
            raise PeerFailed(failed)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size <= 1:
            return tensor
        self._all_ranks_ok()
        parts = [torch.zeros_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj, dst: int = 0):
        if self.world_size <= 1:
            return [obj]
        self._all_ranks_ok()
        result = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, result, dst=dst)
        return result

    def barrier(self) -> None:
        if self.world_size > 1:
            self._all_ranks_ok()
            dist.barrier()


class PeerFailed(Exception):
    """Another rank failed the current task: every rank skips it."""


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg[:300]}" if msg else type(e).__name__


def flatten_results(results: dict) -> dict[str, dict[str, float]]:
    """lm-eval's {"task": {"acc,none": v, "alias": ...}} -> {"task": {"acc": v}} (filter kept if not 'none')."""
    flat = {}
    for task, metrics in results.items():
        row = {}
        for key, v in metrics.items():
            if key == "alias" or not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            name, _, filt = key.partition(",")
            name = "samples" if name == "sample_len" else name  # documents scored, not a metric
            row[name if filt in ("", "none") else f"{name}[{filt}]"] = float(v)
        flat[task] = row
    return flat


def unknown_tasks(tasks, include_path=None) -> dict:
    """{task: close names} for the tasks that no lm-eval task YAML (built in, or under include_path)
    mentions at all: a scan of the YAML text in a second or two, where building lm-eval's registry
    takes a minute. Conservative: a name that appears anywhere in a YAML counts as known, so only a
    name the registry cannot have is reported."""
    import difflib
    import re
    from pathlib import Path

    import lm_eval.tasks

    roots = [Path(lm_eval.tasks.__file__).parent] + ([Path(include_path)] if include_path else [])
    words, names = set(), set()
    declared = re.compile(r"^\s*(?:task|group|tag)\s*:\s*[\"']?([\w\-.]+)", re.M)
    for root in roots:
        for f in root.rglob("*.yaml"):
            text = f.read_text(errors="ignore")
            words.update(re.findall(r"[\w\-.]+", text))
            names.update(declared.findall(text))
    return {t: difflib.get_close_matches(t, sorted(names), n=3) for t in tasks if t not in words}


def run_tasks(lm: NanoLM, tasks, include_path=None, limit=None, num_fewshot=None,
              bootstrap_iters: int = 1000, seed: int = 1234, echo=print) -> tuple[dict, dict]:
    """Evaluate tasks one at a time, so one whose data cannot be fetched fails alone with one line.

    Under torchrun a task can fail on some ranks only (a download, an out-of-memory batch): the
    ranks agree on success before each of the evaluator's collectives and once more at the end of
    the task (NanoLM.agree), so a failure anywhere makes every rank skip the task together
    instead of leaving the others waiting in a collective.

    Returns ({task: {metric: value}} (rank 0 only), {task: reason} for the failures)."""
    import contextlib
    from unittest import mock

    from lm_eval import evaluator, simple_evaluate
    from lm_eval.tasks import TaskManager

    # simple_evaluate adds environment info to its results by running `pip list` (about a second, once
    # per task); we keep only out["results"], so skip it.
    no_env_info = (mock.patch.object(evaluator, "add_env_info", lambda results: None)
                   if hasattr(evaluator, "add_env_info") else contextlib.nullcontext())

    # Indexing the ~15k built-in tasks takes a minute: skip it when include_path has everything asked for.
    tm = TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    if tm is None or any(t not in tm.all_tasks for t in tasks):
        if lm.rank == 0:
            echo("tasks: building lm-eval's task registry (it indexes ~15k task files: about a minute)")
        tm = TaskManager(include_path=include_path)
    results, failures = {}, {}
    for task in tasks:
        if task not in tm.all_tasks:
            failures[task] = "unknown task (not in lm-eval's registry" + (
                f" nor in {include_path})" if include_path else ")"
            )
        else:
            # Every rank makes exactly one agree() call after the last one the evaluator made
            # for it: at the end of a task, on failure, or (PeerFailed) in the call that reported it.
            try:
                with no_env_info:
                    out = simple_evaluate(model=lm, tasks=[task], task_manager=tm, limit=limit,
                                          num_fewshot=num_fewshot, bootstrap_iters=bootstrap_iters,
                                          log_samples=False, random_seed=seed, numpy_random_seed=seed,
                                          torch_random_seed=seed, fewshot_random_seed=seed)
            except PeerFailed as e:
                failures[task] = str(e)
            except Exception as e:  # typically: the dataset cannot be downloaded (no internet, no cache)
                failures[task] = lm.agree(_one_line(e)) if lm.world_size > 1 else _one_line(e)
            else:
                failed = lm.agree(None)
                if failed is not None:
                    failures[task] = failed
                elif out is not None:  # None on ranks > 0
                    results.update(flatten_results(out["results"]))
        if task in failures and lm.rank == 0:
            echo(f"task {task} failed, skipped: {failures[task]}")
    return results, failures


def hub_unreachable(timeout: float = 3.0):
    """None when lm-eval's tasks can fetch their data: the Hugging Face hub ($HF_ENDPOINT, default
    huggingface.co) accepts a connection, or HF_DATASETS_OFFLINE / HF_HUB_OFFLINE says the data is in a local
    cache; else "host:port", found in at most `timeout` seconds (once, instead of every task's retries)."""
    import os
    import socket
    from urllib.parse import urlparse

    if any(os.environ.get(k, "").lower() in ("1", "true", "yes") for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")):
        return None
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return None
    except OSError:
        return f"{host}:{port}"
