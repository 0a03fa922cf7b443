"""Speed levers of the training step, each behind a flag and off by default: measured on a GPU
only at 2 layers of BERT-Large width (docs/training.md, "Speed levers"). Each computes what the
plain step computes (tests/test_levers.py):

``--cuda_graphs``   the compiled step (--compile) replayed as CUDA graphs: torch.compile with
                    inductor's CUDA graphs (mode "reduce-overhead") for the forward, the backward
                    and the update (which mutates only static inputs: trainer/step.py); batches of
                    one shape (the loaders' are); on several ranks with per-replica clipping only
                    (the all-reduce runs between the graphs).
``--fused_update``  clipping, accumulation and the LAMB/AdamW update compiled (trainer/step.py),
                    also without --compile, with inductor's combo kernels (the per-parameter
                    kernels of one foreach op fused horizontally).
``--fp8``           the encoder's dense layers multiply in float8 in training, by torchao's float8
                    training (``--fp8_recipe``: tensorwise or rowwise dynamic scaling); the eval
                    stays bf16; with --fused_qkv one float8 GEMM over the stacked q, k, v weights
                    (``fp8_stacked``); bf16 only (--dtype=fp32 is refused). A closed submission
                    needs a convergence run within the RCPs first.
``--fused_qkv``     each layer's query, key and value projections as one GEMM over their weights
                    stacked [3h, h] (the parameters stay three, under the reference's names).

A lever that does not pay is removed (its flag then says so: flags.REMOVED_FLAGS), as
--pad_vocab was.
"""
import torch

from mlperf_bert.errors import UserError
from mlperf_bert.fileio import check_compile_cache
from mlperf_bert.trainer import attention, flag_checks
from mlperf_bert.trainer.trainer_flags import RECIPES


# The order the levers are applied in (``Trainer.__init__``): every refusal first (``refuse``), then
# the model's conversions (``convert_model``: float8, fused QKV; the model keeps its Parameters),
# then the step's wrappers (``ddp``, then ``wrap_step``: compile, the compiled update, CUDA graphs).

def check_device(cfg, device, world):
    """Refusals that need the device and rank count (those without torch: flag_checks.check_lever_ranks)."""
    lv = cfg.levers
    if lv.cuda_graphs and device.type != "cuda":
        raise UserError(flag_checks.cuda_graphs_needs_cuda(device.type))
    flag_checks.check_lever_ranks(cfg, world, device.type)
    if lv.fp8 and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise UserError("--fp8 needs float8 matmuls (compute capability 8.9+, e.g. H100; this GPU has %d.%d): "
                        "drop --fp8" % torch.cuda.get_device_capability(device))


def refuse(cfg, device, world):
    """1. Every refusal of the levers, before anything is built."""
    flag_checks.check_lever_flags(cfg)
    check_device(cfg, device, world)
    if cfg.levers.compile or cfg.levers.fused_update:  # (inductor's: the levers that compile)
        check_compile_cache(device.type)


def convert_model(model, lv):
    """2. The model's conversions (``lv``: the RunConfig's levers): float8 twins of the encoder's
    dense layers, then fused QKV (with both, one float8 GEMM over the stacked weights)."""
    if lv.fp8:
        enable_fp8(model, lv.fp8_recipe)
    if lv.fused_qkv:
        enable_fused_qkv(model)


def compile_options(lv, update=False):
    """torch.compile's keyword arguments for the model (update=False) or the update."""
    options = {}
    if lv.cuda_graphs:
        options["triton.cudagraphs"] = True  # what mode="reduce-overhead" sets
    if update and lv.fused_update:
        options["combo_kernels"] = True
    return {"options": options} if options else {}


# ---------------------------------------------------------------- fused QKV

def enable_fused_qkv(model):
    from mlperf_bert.trainer import model as modeling
    layers = [m for m in model.modules() if isinstance(m, modeling.SelfAttention)]
    for m in layers:
        m.fused = True
    return layers


# ---------------------------------------------------------------- float8 matmuls (torchao)

def _torchao_float8():
    """``torchao.float8``, imported on first use: only --fp8 needs it. The torchao wheel also
    loads CUDA kernels of other features at import, which fail without CUDA, and registers a type
    with torch's pytree in a way torch 2.13 calls deprecated; float8 training needs neither, so
    their warnings are kept out of the run's output."""
    import logging
    logs = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
    except ImportError as e:
        raise UserError("--fp8 runs on torchao's float8 training, which does not import here (%s): install "
                        "requirements.txt (it pins torchao), or drop --fp8" % e) from None
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)
    return float8


def fp8_layers(model):
    """The encoder's dense layers (query, key, value, attention output, intermediate, output):
    not the embeddings, the pooler, the MLM transform or the heads."""
    from mlperf_bert.trainer import model as modeling
    return [m for m in model.bert.encoder.modules() if isinstance(m, modeling.Linear)]


def enable_fp8(model, recipe="tensorwise"):
    """Give each of ``fp8_layers(model)`` a float8 twin made by torchao's
    ``convert_to_float8_training`` with ``recipe``'s ``Float8LinearConfig``: a ``Float8Linear``
    that holds the layer's own weight and bias Parameters. The layer runs its twin in training
    and plain F.linear (bf16 under autocast) in eval, so the eval that decides the MLPerf target
    never multiplies in float8. The twin is kept out of the module tree (not a submodule):
    checkpoints, the optimizer and DDP see the bf16 model's parameters under its names."""
    if recipe not in RECIPES:
        raise UserError("--fp8_recipe=%s is not one of %s" % (recipe, ", ".join(RECIPES)))
    layers = fp8_layers(model)
    for m in layers:
        if m.in_features % 16 or m.out_features % 16:  # torch._scaled_mm's rule for every operand
            raise UserError("--fp8 multiplies matrices whose sizes are multiples of 16; this config has a %dx%d "
                            "dense layer: drop --fp8" % (m.out_features, m.in_features))
    float8 = _torchao_float8()
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    for m in layers:
        # a root nn.Linear is not converted in place: torchao returns a new Float8Linear
        object.__setattr__(m, "fp8", float8.convert_to_float8_training(m, config=config))
    return layers


# ---------------------------------------------------------------- the step's wrappers

# DDP's bucket cap (clipping after the reduction). Under --compile dynamo's DDP optimizer also
# splits the compiled model at each bucket (one graph a bucket: a graph boundary inductor cannot
# fuse across, each compiled on its own); its own split of BERT-Large (bench/ddp_graphs.py) gives
# 38 graphs at 25 MB (DDP's default), 20 at 64, 11 at 128, 6 at 256. What a cap cannot shorten:
# the all-reduce left after the backward ends is that of the last bucket, which holds the word
# embeddings (tied to the MLM decoder: their gradient is complete only when the backward is;
# 119 MiB), so any cap up to 128 MB leaves the same ~125 MB tail (by the arithmetic 0.6 ms inside
# an 8-GPU node, ~5.5 ms across nodes: not measured on a GPU; docs/training.md, Multi-GPU) and
# 128 has the fewest graphs of those; 256 doubles the tail.
DDP_BUCKET_MB = 128


def ddp_options(steps_per_update):
    """DDP's options beyond the defaults (clipping after the reduction). ``gradient_as_bucket_view``:
    the gradients are views of DDP's buckets, kept and zeroed in place after each update
    (GradientAccumulator ``keep_grads``), so the backward accumulates into the buckets: no second
    copy of the gradients (1.34 GB for BERT-Large) and no copy into and out of the buckets.
    ``static_graph`` only at one micro-step an update: with ``no_sync()`` (accumulation) DDP's
    static graph asserts on the first backward or stops reducing after it (pytorch/pytorch#187732,
    open; tests/test_levers.py shows it on this torch)."""
    return {"gradient_as_bucket_view": True, "static_graph": steps_per_update == 1}


def no_buffer_sync():
    """DDP's option that turns off its broadcast of the module's buffers before each forward (the
    model has none: a broadcast of nothing). Torch 2.13 names it ``forward_sync_buffers`` and warns
    (FutureWarning, once a rank) on the older ``broadcast_buffers``, which earlier versions alone
    take."""
    import inspect
    params = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers": False}


def ddp(model, device, world, optim):
    """3a. DDP over ``model`` (clipping after the reduction on several ranks); ``optim``: the
    RunConfig's section."""
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=DDP_BUCKET_MB, **no_buffer_sync(), **ddp_options(optim.steps_per_update))


def wrap_step(model, ddp_model, accumulator, lv):
    """3b. The step's functions with the levers of ``lv`` -> (forward, eval_forward or None,
    after_backward): the forward (DDP's, or the model's)
    compiled, the update compiled (trainer/step.py), the compiled forward replayed as CUDA graphs."""
    forward, eval_forward, after_backward = ddp_model or model, None, accumulator.after_backward
    if lv.compile:  # trainer/step.py: no graph breaks, no recompiles after the first update/eval
        attention.trace_as_constants()
        # static shapes: the warm-up compiles the run's (training and eval differ in batch;
        # automatic dynamic shapes would recompile the second as a dynamic graph)
        forward = torch.compile(forward, dynamic=False, **compile_options(lv))
        eval_forward = torch.compile(model, dynamic=False, **compile_options(lv))
    if lv.compile or lv.fused_update:
        import functools
        from mlperf_bert.trainer import step
        compile_update = functools.partial(torch.compile, **compile_options(lv, update=True))
        after_backward = step.CompiledUpdate(accumulator, compile_update, graphed=lv.cuda_graphs).after_backward
    if lv.cuda_graphs:
        forward = Graphed(forward)
    return forward, eval_forward, after_backward


class Graphed:
    """The compiled forward as a CUDA-graph replay: one batch shape, a new graph generation per
    micro-step, and the loss copied out of the graph's memory (the next replay reuses it)."""

    def __init__(self, forward):
        self.forward = forward
        self.shapes = None

    def __call__(self, **batch):
        shapes = {k: tuple(v.shape) for k, v in batch.items()}
        if self.shapes is None:
            self.shapes = shapes
        elif shapes != self.shapes:
            raise UserError("--cuda_graphs replays batches of one shape: this batch has %s, the first %s; "
                            "drop --cuda_graphs" % (_diff(shapes, self.shapes), _diff(self.shapes, shapes)))
        torch.compiler.cudagraph_mark_step_begin()
        out = self.forward(**batch)
        return out._replace(loss=out.loss.clone())


def _diff(a, b):
    return ", ".join("%s %s" % (k, list(v)) for k, v in sorted(a.items()) if b.get(k) != v)
