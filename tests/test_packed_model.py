"""The model on packed rows: per-sequence MLM/NSP logits, loss, metric sums and gradients equal to
the unpacked forward of the same real sequences (fp32), with the dense block mask and with the
variable-length segments FlashAttention gets on CUDA (run here by the per-segment reference
kernel), no cross-contamination, bf16 runs."""
import numpy as np
import pytest
import torch

from mlperf_bert.dataset import packing, tfrecord
from mlperf_bert.dataset.example import decode_pretraining_batch
from mlperf_bert.trainer import attention
from mlperf_bert.trainer.config import BertConfig
from mlperf_bert.trainer.model import BertForPreTraining

# A vocabulary of 2048 (the real ids folded into it, see ``sequences``): the MLM decoder over 30522
# words was 80% of these tests' CPU, and no packing path depends on the vocabulary's size.
CFG = BertConfig(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, max_position_embeddings=512, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def sequences(golden_s512):
    """12 real seq-512 sequences of varied lengths (short ones that pack, and full ones), their
    word ids folded into CFG's vocabulary."""
    recs = [r for _, r in zip(range(400), tfrecord.read_records(golden_s512))]
    a = decode_pretraining_batch(recs, 512, 76)
    lengths = packing.sequence_lengths(a["input_mask"])
    short = [i for i in np.argsort(lengths, kind="stable") if lengths[i] >= 20][:9]
    full = [i for i in range(len(lengths)) if lengths[i] == 512][:3]
    pick = sorted(short + full)
    out = {k: v[pick].astype(np.float32 if k == "masked_lm_weights" else np.int64) for k, v in a.items()}
    for k in ("input_ids", "masked_lm_ids"):  # [PAD], [CLS], [SEP], [MASK] and ids below 1000 stay as they are
        ids = out[k]
        out[k] = np.where(ids < 1000, ids, 1000 + (ids - 1000) % (CFG.vocab_size - 1000))
    assert (out["input_ids"] >= 1000).sum() > 1000  # still mostly words
    return out


def tensors(arrays):
    return {k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()}


def unpacked_batch(a):
    b = tensors(a)
    b["next_sentence_labels"] = b["next_sentence_labels"].reshape(-1)
    return b


def packed_batch(a, k=3):
    lengths = packing.sequence_lengths(a["input_mask"])
    groups = packing.pack_groups(lengths, 512, k)
    assert len(groups) < len(lengths) and max(len(g) for g in groups) > 1  # it really packs
    p = tensors(packing.pack_arrays(a, groups, k))
    return {name: v.long() if name != "masked_lm_weights" else v.float() for name, v in p.items()}, groups


def model():
    torch.manual_seed(0)
    m = BertForPreTraining(CFG)
    m.eval()
    return m


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


@pytest.fixture(params=["dense", "varlen"])
def kernel(request, monkeypatch):
    """The packed attention path: the dense mask (CPU), or segments (FlashAttention's layout)."""
    if request.param == "varlen":
        monkeypatch.setattr(attention, "varlen_kernel", lambda device, dtype, head_dim: attention.reference_varlen)
    return request.param


def test_packed_segments_are_each_rows_sequences_then_its_padding():
    mask = torch.tensor([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1], [1, 2, 3, 3, 0, 0]])
    assert attention.packed_segments(mask, 3).tolist() == [0, 3, 5, 5, 6, 12, 12, 12, 12, 13, 14, 16, 18]
    assert attention.packed_segments(mask, 3).dtype == torch.int32


def test_packed_rows_use_the_dense_mask_where_flash_does_not_run():
    mask = torch.tensor([[1, 1, 2, 0]])
    for dtype in (torch.float32, torch.bfloat16):
        assert attention.varlen_kernel(torch.device("cpu"), dtype, 64) is None
        dense = attention.packed_mask(mask, 3, dtype, 64)
        assert torch.equal(dense, attention.packed_additive_mask(mask)) and dense.shape == (1, 1, 4, 4)


def test_packed_forward_equals_unpacked_per_sequence(sequences, kernel):
    m = model()
    out_u, (mlm_u, nsp_u) = m(**unpacked_batch(sequences), return_logits=True)
    packed, groups = packed_batch(sequences)
    out_p, (mlm_p, nsp_p) = m(**packed, return_logits=True)
    # logits of each sequence: unpacked order is sequence order; packed order is row/slot order
    order = [i for g in groups for i in g]
    w = sequences["masked_lm_weights"]
    per_seq = np.split(np.arange(int((w != 0).sum())), np.cumsum((w != 0).sum(1))[:-1])
    mlm_u_by_packed = torch.cat([mlm_u[per_seq[i]] for i in order])
    assert mlm_p.shape == mlm_u_by_packed.shape and nsp_p.shape == (len(order), 2)
    assert rel(mlm_p, mlm_u_by_packed) < 1e-5
    assert rel(nsp_p, nsp_u[order]) < 1e-5
    for name in ("loss", "mlm_loss", "nsp_loss", "mlm_nll_sum", "nsp_nll_sum"):
        assert rel(getattr(out_p, name), getattr(out_u, name)) < 1e-5, name
    for name in ("mlm_correct", "mlm_weight", "nsp_correct", "nsp_count"):
        assert getattr(out_p, name).item() == getattr(out_u, name).item(), name
    assert out_p.nsp_count.item() == len(order)


def test_packed_gradients_equal_unpacked(sequences, kernel):
    grads = []
    for batch in (unpacked_batch(sequences), packed_batch(sequences)[0]):
        m = model()
        m(**batch).loss.backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    # the key bias's gradient is zero in exact arithmetic (softmax ignores a per-query constant):
    # its rounding noise (1e-13) is measured against the largest gradient of all. Rounding alone
    # (the two batches' matmuls have other shapes) was at most 3.1e-6 of that under torch 2.13 (this
    # project's pin) and 1.8e-5 under torch 2.11+cu130 (the GPU machine's, on this CPU: the NSP head's
    # bias, a sum of terms of both signs); sequences that attend across their row's boundary
    # (one segment a row) differ by 0.08-0.4 at the worst parameter
    scale = max(g.abs().max().item() for g in grads[0].values())
    for name in grads[0]:
        diff = (grads[1][name].double() - grads[0][name].double()).abs().max().item()
        assert diff <= 1e-4 * max(grads[0][name].abs().max().item(), 1e-3 * scale), name


def test_no_cross_contamination_and_positions_restart(sequences):
    m = model()
    packed, groups = packed_batch(sequences)
    row = next(r for r, g in enumerate(groups) if len(g) >= 2)
    _, (mlm, nsp) = m(**packed, return_logits=True)
    changed = {k: v.clone() for k, v in packed.items()}
    second = changed["input_mask"][row] == 2
    changed["input_ids"][row][second] = 1000 + torch.arange(int(second.sum())) % 500  # other tokens
    _, (mlm2, nsp2) = m(**changed, return_logits=True)
    # sequence 1 of that row: its NSP logit and its MLM slots are unchanged; sequence 2's change
    seq_index = sum(len(g) for g in groups[:row])
    assert torch.equal(nsp[seq_index], nsp2[seq_index])
    assert not torch.equal(nsp[seq_index + 1], nsp2[seq_index + 1])
    p = packed["masked_lm_positions"].shape[1] // 3
    w = packed["masked_lm_weights"]
    before = int((w[:row] != 0).sum())
    first_slots = int((w[row, :p] != 0).sum())
    assert torch.equal(mlm[before:before + first_slots], mlm2[before:before + first_slots])
    # positions restart: the second sequence's first token has position 0
    start = int(packed["nsp_positions"][row, 1])
    assert start > 0 and packed["position_ids"][row, start].item() == 0


def test_packed_bf16_autocast_runs(sequences):
    m = model()
    packed, _ = packed_batch(sequences)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(**packed)
    out.loss.backward()
    assert torch.isfinite(out.loss) and abs(out.loss.item() - model()(**packed).loss.item()) < 0.1


def test_flash_varlen_call_matches_the_installed_torch_schema():
    """The CUDA call checked without a GPU: fake CUDA tensors run the op's shape function, so
    a signature or layout this torch does not accept fails here (the kernel itself is not run)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(2 * 16, 4, 64, dtype=torch.bfloat16, device="cuda")
        cu = torch.zeros(2 * 4 + 1, dtype=torch.int32, device="cuda")
        out = attention.flash_varlen(q, q, q, cu, 16, 0.1, 0.125)
        assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.device.type == "cuda"


def test_deciding_on_flash_on_cuda_breaks_no_compiled_graph(monkeypatch):
    """On CUDA the choice of the variable-length kernel is made inside the compiled forward.
    ``torch.backends.cuda.flash_sdp_enabled()`` returns a Python bool, which dynamo cannot put in
    a graph ("Unsupported torch.* op returned non-Tensor"): called there, it broke the forward of
    packed rows in two on a GPU, while a CPU returns before it. Here the device is only named
    (its compute capability faked): the decision must trace as a constant, no graph break. It is
    marked so where the trainer compiles (levers.wrap_step under --compile), not at the model's
    import, which imported torch's compiler (~1 s of CPU) in every trainer, compiled or not."""
    import collections
    import torch._dynamo
    from mlperf_bert.trainer import levers, optimizer, run_config
    from mlperf_bert.trainer.accumulation import GradientAccumulator
    marked, mark = [], torch.compiler.assume_constant_result
    monkeypatch.setattr(torch.compiler, "assume_constant_result", lambda fn: mark(marked.append(fn) or fn))
    linear = torch.nn.Linear(2, 2)
    levers.wrap_step(linear, None, GradientAccumulator(linear, optimizer.create_optimizer(linear), 1, lambda s: 1e-4),
                     run_config.Levers(compile=True))
    assert marked == [attention._flash_runs]
    props = collections.namedtuple("Props", "major minor")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props(9, 0))

    def forward(x):
        return x + (attention.varlen_kernel(torch.device("cuda"), torch.bfloat16, 64) is attention.flash_varlen)

    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(forward)(torch.ones(2))
        assert torch.equal(torch.compile(forward, backend="eager", fullgraph=True)(torch.ones(2)), torch.full((2,), 2.0))
    finally:
        torch._dynamo.reset()
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props(7, 5))
    assert attention.varlen_kernel(torch.device("cuda"), torch.bfloat16, 64) is None
