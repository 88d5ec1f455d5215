"""The step-scale measurement of one config: the stream geometry at step 0 and what one optimizer step at
the peak lr does to the logits (scripts/step_scale.py is the command line and says what is measured)."""
from __future__ import annotations

import statistics
from pathlib import Path
from data.files import read_json

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CELLS = {
    "pre_ln": "norm=pre_ln",
    "pre_ln-rms1": "norm=pre_ln,norm.embed_norm=scalenorm",
    "peri_ln": "norm=peri_ln",
    "post_ln": "norm=post_ln",
    "geonorm": "norm=geonorm",                                   # sublayers read Norm(h) (the default)
    "geonorm-raw": "norm=geonorm,norm.sublayer_input=raw",        # sublayers read the raw stream
    "geonorm-raw-r1-a32": "norm=geonorm,norm.sublayer_input=raw,norm.embed_norm=scalenorm,norm.a_init=32",
    "proj_spheret": "norm=proj_spheret",
    "proj_spheret-a32": "norm=proj_spheret,norm.alpha_init=32",
    "cay_spheret": "norm=cay_spheret",
    "ngpt": "norm=ngpt",
}


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from trainer.config_store import register_code_configs

    register_code_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        return hydra_compose("config", overrides=overrides)


LOGITS_BUDGET = 1 << 30  # bytes of fp32 logits one measurement may hold; geometry and the step hold a few times it


def measured_batch(micro: int, block: int, vocab: int, asked: int | None = None) -> int:
    """Sequences in the measured batch: `asked` (--batch), else the config's micro-batch, capped so that its
    fp32 logits fit in LOGITS_BUDGET (gpt_125m's 16 x 1024 x 50,304 would be 3.3 GB, and the step several
    times that: out of memory on a 24 GB machine)."""
    if asked is not None:
        return asked
    return max(1, min(micro, LOGITS_BUDGET // (4 * block * vocab)))


def peak_bytes(n_params: int, n_layer: int, width: int, batch: int, block: int, vocab: int) -> int:
    """What one measurement holds at its peak, from above: fp32 weights, gradients and AdamW's two moments
    (16 bytes a parameter), per sequence the logits about five times over (the two forwards, the loss's
    gradient, before and after the step) and ~70 fp32 values a token per width per layer kept for backward,
    plus ~0.5 GB of runtime. Against the peak RSS of this code's CPU path it is 3-15% high (gpt_125m's
    shape at 2 and 12 layers, 1 and 4 sequences)."""
    per_sequence = 5 * 4 * block * vocab + n_layer * block * 70 * width
    return int(0.5e9 + 16 * n_params + batch * per_sequence)


def available_bytes() -> int | None:
    """The memory the machine can give without swapping (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(n_params: int, n_layer: int, width: int, batch: int, block: int, vocab: int,
               available: int | None) -> None:
    """Refuse, in one line naming the batch that would fit, a measurement the machine cannot hold (a run
    past it is killed by the kernel minutes in, with no word of why)."""
    need = peak_bytes(n_params, n_layer, width, batch, block, vocab)
    if available is None or need <= available:
        return
    fits = [b for b in range(batch - 1, 0, -1) if peak_bytes(n_params, n_layer, width, b, block, vocab) <= available]
    hint = f"pass --batch {fits[0]}" if fits else "no batch fits: use a smaller model.* or block_size"
    from common import UserError

    raise UserError(f"--batch {batch} x {block} tokens needs ~{need / 1e9:.1f} GB ({n_params / 1e6:.0f}M parameters, "
                    f"vocab {vocab}) but {available / 1e9:.1f} GB is available: {hint}")


def batch_for(cfg, random_batch: bool, micro: int, block: int):
    """(x, y, vocab_size): the first training batch of the config's data, or random tokens."""
    import torch

    import data as data_mod

    if random_batch:
        vocab = data_mod.get_tokenizer(cfg.data.tokenizer).vocab_size
        g = torch.Generator().manual_seed(0)
        xy = torch.randint(0, vocab, (micro, block + 1), generator=g)
        return xy[:, :-1], xy[:, 1:], vocab
    data_dir = Path(data_mod.prepare_dataset(cfg.data))
    tok = data_mod.get_tokenizer(read_json(data_dir / "meta.json")["tokenizer"])
    loader = data_mod.TrainLoader(data_dir, micro, block, grad_accum=1, rank=0, world_size=1, seed=0)
    x, y = loader.get_batch(0, 0)
    return x, y, tok.vocab_size


def measure(overrides: list[str], lr: float | None, random_batch: bool, batch: int | None = None) -> dict:
    import torch

    from model import GPT, GPTConfig
    from model.geometry import stream_geometry
    from trainer.config import parse_run_config
    from runtime.checkpoint import seed_all
    from trainer.optim import build_optimizer, for_variant

    cfg = compose(overrides)
    rc = parse_run_config(cfg)
    block = int(cfg.model.block_size)
    import data as data_mod

    vocab = data_mod.get_tokenizer(cfg.data.tokenizer).vocab_size
    micro = measured_batch(rc.train.micro_batch_size, block, vocab, batch)
    model_cfg = GPTConfig.from_hydra(cfg.model, cfg.norm, vocab_size=vocab)
    with torch.device("meta"):  # the parameter count, before anything is allocated
        n_params = sum(p.numel() for p in GPT(model_cfg).parameters())
    check_fits(n_params, model_cfg.n_layer, model_cfg.n_embd, micro, block, model_cfg.vocab_size, available_bytes())
    x, y, vocab = batch_for(cfg, random_batch, micro, block)
    model_cfg = GPTConfig.from_hydra(cfg.model, cfg.norm, vocab_size=vocab)
    seed_all(rc.train.seed)
    model = GPT(model_cfg)
    optim_cfg = for_variant(rc.optim, model.variant)
    opt = build_optimizer(model, optim_cfg, torch.device("cpu"))
    peak = optim_cfg.lr if lr is None else lr
    opt.set_lr(torch.tensor(peak))
    model.eval()  # no dropout: the change is the step's alone
    geo = {k: v.item() for k, v in stream_geometry(model, x, y).items()}
    n = 2 * model_cfg.n_layer
    angles = [geo[f"geo/angle/{j}"] for j in range(n)]
    with torch.no_grad():
        before, loss0 = model(x, y)
    _, loss = model(x, y)
    loss.backward()
    opt.step()
    model.after_optimizer_step(torch.ones((), dtype=torch.bool))
    with torch.no_grad():
        after, loss1 = model(x, y)
    return {"params": model.num_params(), "lr": peak, "batch": tuple(x.shape), "angle_mean": statistics.fmean(angles),
            "angle_min": min(angles), "angle_max": max(angles),
            "rel_update": statistics.fmean(geo[f"geo/rel_update/{j}"] for j in range(n)),
            "f_ratio": statistics.fmean(geo[f"geo/f_ratio/{j}"] for j in range(n)),
            "rms_h0": geo["rms/0"],
            "dlogits": (after - before).pow(2).mean().sqrt().item(), "logits_rms": before.pow(2).mean().sqrt().item(),
            "loss0": loss0.item(), "dloss": (loss1 - loss0).item()}


def table(results: dict[str, dict]) -> str:
    lines = ["| cell | params | stream RMS | angle at init, mean [min, max] (rad) | rel. update | "
             "‖F‖/‖h‖ | lr | RMS Δlogits, one step | Δloss, one step |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['params'] / 1e6:.2f}M | {r['rms_h0']:.3g} | {r['angle_mean']:.3g} "
                     f"[{r['angle_min']:.2g}, {r['angle_max']:.2g}] | {r['rel_update']:.3g} | {r['f_ratio']:.3g} | "
                     f"{r['lr']:g} | {r['dlogits']:.3g} | {r['dloss']:+.3g} |")
    return "\n".join(lines)
