"""The torch floor in requirements.txt: every torch API the code uses is known, with the version
that first shipped it, and the floor is the newest of those versions (no lower: an older torch
would fail at the first call; no higher: it would refuse torch builds that work)."""
import ast
import re
from pathlib import Path

import torch

import pytest

REPO = Path(__file__).resolve().parents[1]

# Every torch name the repository uses (attribute chains from `torch`, `from torch... import`), by
# the first release that has it. Names older than 2.0 are listed under 2.0. A new use of torch
# fails the test until it is added here, with its version from the torch release notes.
SINCE = {
    "2.6": ["torch.nn.utils.get_total_norm", "torch.nn.utils.clip_grads_with_norm_"],
    "2.5": ["torch.serialization.safe_globals"],
    "2.4": [
        "torch.nn.functional.rms_norm",
        "torch.distributed.distributed_c10d._set_pg_timeout",  # private, tests only
        "torch.is_autocast_enabled",  # with a device type
        "torch.get_autocast_dtype",
    ],
    "2.3": ["torch.compiler.is_compiling", "torch.amp.GradScaler"],
    "2.0": """
        torch.einsum torch.optim torch.optim.SGD torch.nn.functional.silu torch.nn.functional.relu
        torch.nn.functional.normalize
        torch.complex torch.polar torch.Generator torch.Tensor torch.__version__ torch._dynamo.reset torch._foreach_norm
        torch._foreach_sub torch.addcmul torch.amp torch._dynamo.utils.counters torch._dynamo.config
        torch.linspace torch.softmax
        torch.atan2 torch.acos torch.count_nonzero torch.sigmoid torch.erf torch.logsumexp torch.nn.functional.one_hot
        torch.allclose torch.arange torch.are_deterministic_algorithms_enabled torch.atan torch.autocast
        torch.autograd.Function torch.autograd.function.once_differentiable torch.autograd.grad
        torch.autograd.gradcheck torch.autograd.graph.saved_tensors_hooks torch.backends.cuda.matmul.allow_tf32
        torch.backends.cudnn.allow_tf32 torch.backends.cudnn.benchmark torch.bfloat16 torch.bool torch.cat
        torch.compile torch.cos torch.cuda.get_device_name torch.cuda.get_rng_state torch.cuda.set_rng_state
        torch.cuda.current_device torch.cuda.device_count torch.cuda.is_available torch.cuda.is_bf16_supported
        torch.cuda.set_device torch.cuda.synchronize torch.cuda.max_memory_allocated torch.cuda.memory_allocated
        torch.cuda.reset_peak_memory_stats torch.cuda.get_device_properties torch.cuda.empty_cache
        torch.cuda.OutOfMemoryError torch.Tensor.tolist
        torch.device torch.distributed.ReduceOp.MAX torch.distributed.ReduceOp.SUM
        torch.distributed.all_gather torch.distributed.all_gather_object torch.distributed.all_reduce
        torch.distributed.barrier torch.distributed.broadcast_object_list torch.distributed.destroy_process_group
        torch.distributed.gather_object torch.distributed.get_world_size torch.distributed.get_rank
        torch.distributed.init_process_group torch.distributed.is_initialized torch.distributed.new_group
        torch.dtype torch.enable_grad torch.equal torch.eye torch.float16 torch.float32 torch.float64
        torch.from_numpy torch.full torch.full_like torch.get_num_threads torch.get_rng_state torch.int64
        torch.is_grad_enabled torch.isfinite torch.linalg.inv torch.linalg.vector_norm torch.load torch.log
        torch.log_softmax torch.logspace torch.long torch.manual_seed torch.multinomial torch.nn.Dropout
        torch.nn.Embedding torch.nn.Identity torch.nn.LayerNorm torch.nn.Linear torch.nn.Module
        torch.nn.ModuleList torch.nn.Parameter torch.nn.functional.cross_entropy torch.nn.functional.gelu
        torch.nn.functional.layer_norm torch.nn.functional.linear torch.nn.functional.scaled_dot_product_attention
        torch.nn.functional.softmax torch.nn.functional.softplus torch.nn.init.normal_ torch.nn.init.zeros_
        torch.nn.parallel.DistributedDataParallel torch.nn.utils.clip_grad_norm_ torch.no_grad torch.ones
        torch.ones_like torch.optim.AdamW torch.optim.Optimizer torch.rand torch.randint torch.randn
        torch.randn_like torch.save torch.set_default_dtype torch.set_grad_enabled torch.set_num_threads
        torch.set_rng_state torch.sin torch.sort torch.stack torch.tanh torch.tensor torch.testing.assert_close
        torch.topk torch.triu torch.use_deterministic_algorithms torch.utils._python_dispatch.TorchDispatchMode
        torch.where torch.zeros torch.zeros_like torch.float torch.cuda torch.empty_like torch.exp
        torch._inductor.compile_fx.compile_fx torch.set_flush_denormal torch.int32
    """.split(),
}
# Newer than the floor, used only behind a version check that gives one line naming the version
# needed (so they do not raise the floor): `optim=muon` needs torch.optim.Muon (2.9).
OPTIONAL = {"torch.optim.Muon": "2.9"}
# Keyword arguments newer than their function (checked where the call spells them out).
KEYWORD_SINCE = {"torch.load(mmap=)": "2.1", "torch.distributed.init_process_group(device_id=)": "2.3",
                 "torch.load(weights_only=)": "2.0"}


def _version(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


def _torch_uses():
    """{api: files} and {api(kw=): files} for every .py file of the repository."""
    names, keywords = {}, {}
    for f in sorted(REPO.rglob("*.py")):
        rel = f.relative_to(REPO)
        if any(p.startswith(".") for p in rel.parts):
            continue
        tree = ast.parse(f.read_text())
        alias = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "torch":
                        alias[a.asname or "torch"] = a.name if a.asname else "torch"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
                for a in node.names:
                    alias[a.asname or a.name] = f"{node.module}.{a.name}"
                    names.setdefault(f"{node.module}.{a.name}", set()).add(str(rel))

        def resolve(n):
            chain = []
            while isinstance(n, ast.Attribute):
                chain.append(n.attr)
                n = n.value
            if isinstance(n, ast.Name) and n.id in alias:
                return ".".join([alias[n.id], *reversed(chain)])
            return None

        inner = set()  # Attribute nodes that are the prefix of a longer chain
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
                inner.add(id(node.value))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and id(node) not in inner:
                api = resolve(node)
                if api:
                    names.setdefault(api, set()).add(str(rel))
            if isinstance(node, ast.Call):
                api = resolve(node.func)
                for k in node.keywords if api else ():
                    if k.arg:
                        keywords.setdefault(f"{api}({k.arg}=)", set()).add(str(rel))
    return names, keywords


def _floor() -> tuple:
    for line in (REPO / "requirements.txt").read_text().splitlines():
        m = re.match(r"\s*torch\s*>=\s*([\d.]+)", line)
        if m:
            return _version(m[1])
    raise AssertionError("requirements.txt has no torch>=X.Y line")


@pytest.mark.slow
def test_every_torch_api_used_is_classified_and_the_floor_is_the_newest():
    since = {api: _version(v) for v, apis in SINCE.items() for api in apis}
    names, keywords = _torch_uses()
    for api in OPTIONAL:
        names.pop(api, None)
    unknown = {api: sorted(files) for api, files in names.items() if api not in since}
    assert not unknown, f"torch APIs not in SINCE (add them with the release that introduced them): {unknown}"
    needed = max([since[a] for a in names] + [_version(KEYWORD_SINCE[k]) for k in keywords if k in KEYWORD_SINCE])
    newest = sorted(a for a in names if since[a] == needed)
    assert _floor() == needed, (f"requirements.txt says torch>={'.'.join(map(str, _floor()))}, but the code needs "
                                f"{'.'.join(map(str, needed))} for {newest}")


def test_the_table_names_real_torch_apis():
    """Catches typos in SINCE (checked against the installed torch, which is above the floor)."""
    import importlib

    for apis in [*SINCE.values(), list(OPTIONAL)]:
        for api in apis:
            parts = api.split(".")
            obj = importlib.import_module(parts[0])
            for i, p in enumerate(parts[1:], 1):
                try:
                    obj = getattr(obj, p)
                except AttributeError:
                    obj = importlib.import_module(".".join(parts[:i + 1]))
            assert obj is not None, api
    assert _version(torch.__version__) >= _floor()
