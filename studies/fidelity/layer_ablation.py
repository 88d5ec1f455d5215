"""How much each block matters: the validation-loss increase when one block is skipped.

    python studies/fidelity/layer_ablation.py RUN_DIR [--tokens 65536] [--out FILE.png]

Skipping block k passes the residual stream through it unchanged (both sublayers and the variant's
rule around them), the test of "The Curse of Depth" (arXiv 2502.05795, Fig. 1): in a Pre-LN model
the deep blocks' removal costs little, because the stream's growing norm shrinks their relative
contribution. Writes RUN_DIR/layer_ablation.json (base loss, loss and increase per skipped block)
and a bar chart (RUN_DIR/layer_ablation.png unless --out).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn as nn

from data.files import atomic_write
from common import report_user_errors
from data.loader import ValLoader
from runtime.checkpoint import load_model


class SkippedBlock(nn.Module):
    """Stands in for a block: the stream passes unchanged (and is recorded twice, one per sublayer). It keeps the
    block's two rules, so the model's list of rules (and what a variant computes from them once per forward,
    Variant.shared) is the same as with the block in place."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.attn_rule, self.mlp_rule = block.attn_rule, block.mlp_rule

    def forward(self, h, cache=None, hidden=None, rope=None, outputs=None, shared=None, values=None, scale=None):
        if hidden is not None:
            hidden += [h, h]
        if outputs is not None:  # two sublayers that add nothing
            outputs += [torch.zeros_like(h), torch.zeros_like(h)]
        return h


@torch.no_grad()
def val_loss(model, loader) -> float:
    total, count = 0.0, 0
    for x, y in loader:
        _, loss = model(x, y)
        n = int((y >= 0).sum())
        total, count = total + loss.item() * n, count + n
    return total / count


def ablate(run_dir: Path, tokens: int) -> dict:
    model, ckpt = load_model(run_dir)
    data_dir = Path(ckpt.get("data_dir") or "")
    if not (data_dir / "meta.json").is_file():
        raise SystemExit(f"{run_dir}: its data dir {data_dir} is gone (prepare the data again)")
    loader = ValLoader(data_dir, 8, model.config.block_size, token_budget=tokens)
    base = val_loss(model, loader)
    losses = []
    for k in range(len(model.blocks)):
        block = model.blocks[k]
        model.blocks[k] = SkippedBlock(block)
        losses.append(val_loss(model, loader))
        model.blocks[k] = block
    return {"run": str(run_dir), "norm": model.config.norm.name, "step": ckpt["step"], "tokens": loader.num_tokens,
            "base_loss": base, "skipped_loss": losses, "increase": [x - base for x in losses]}


def plot(result: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    inc = result["increase"]
    fig, ax = plt.subplots(figsize=(max(4, 0.35 * len(inc) + 2), 3))
    ax.bar(range(1, len(inc) + 1), inc, color="tab:blue")
    ax.set_xlabel("skipped block")
    ax.set_ylabel("val loss increase (nats)")
    ax.set_yscale("symlog", linthresh=1e-2)
    ax.set_title(f"{result['norm']}: base val loss {result['base_loss']:.3f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--tokens", type=int, default=65536, help="validation tokens scored per evaluation")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    ap.add_argument("--out", type=Path, help="bar chart path (default RUN_DIR/layer_ablation.png)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = report_user_errors(ablate, args.run_dir, args.tokens)  # a bad run dir: one line
    out = args.run_dir / "layer_ablation.json"
    atomic_write(out, json.dumps(result, indent=1) + "\n")
    plot(result, args.out or args.run_dir / "layer_ablation.png")
    print(f"{result['norm']}: base {result['base_loss']:.4f}; increase per skipped block: "
          + ", ".join(f"{x:+.3f}" for x in result["increase"]))
    return 0


if __name__ == "__main__":
    sys.exit(report_user_errors(main))
