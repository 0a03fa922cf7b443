"""The model's losses and metrics on crafted batches whose values are computed by hand."""
import math

import pytest
import torch

from mlperf_bert.trainer.config import BertConfig
from mlperf_bert.trainer.model import BertForPreTraining

CFG = BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=10)


def crafted_model():
    """Heads whose outputs do not depend on the encoder: MLM log-probs are log(P), NSP log(Q).

    transform dense = 0 -> GELU(0) = 0 -> LayerNorm(0) = beta = 0, so MLM logits are the
    output bias; pooler dense = 0 -> tanh(0) = 0, so NSP logits are the NSP bias.
    """
    torch.manual_seed(0)
    m = BertForPreTraining(CFG).eval()
    P = torch.full((20,), 0.25 / 18)
    P[3], P[7] = 0.5, 0.25
    with torch.no_grad():
        m.cls.predictions.transform.dense.weight.zero_()
        m.cls.predictions.transform.dense.bias.zero_()
        m.cls.predictions.output_bias.copy_(P.log())
        m.bert.pooler.dense.weight.zero_()
        m.bert.pooler.dense.bias.zero_()
        m.cls.seq_relationship.output_bias.copy_(torch.tensor([0.8, 0.2]).log())
    return m


def batch(labels, weights, nsp, b=3, t=8):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 20, (b, t), generator=g)
    pos = torch.tensor([[1, 2, 5]] * b)
    return (ids, torch.zeros(b, t, dtype=torch.long), torch.ones(b, t, dtype=torch.long), pos,
            torch.tensor(labels), torch.tensor(weights), torch.tensor(nsp))


def test_losses_and_accuracy_by_hand():
    m = crafted_model()
    labels = [[3, 7, 3], [0, 3, 7], [7, 7, 5]]
    weights = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    with torch.no_grad():
        out = m(*batch(labels, weights, [[0], [1], [0]]))
    # weighted positions: 3 (right), 7, 0, 3 (right), 7, 7 -> 2 of 6 correct (argmax is 3)
    nll = -math.log(0.5) * 2 - math.log(0.25) * 3 - math.log(0.25 / 18)
    assert out.mlm_weight.item() == 6.0
    assert out.mlm_correct.item() == 2.0
    assert out.mlm_nll_sum.item() == pytest.approx(nll, rel=1e-6)
    assert out.mlm_loss.item() == pytest.approx(nll / (6 + 1e-5), rel=1e-6)
    nsp = (-2 * math.log(0.8) - math.log(0.2))
    assert out.nsp_nll_sum.item() == pytest.approx(nsp, rel=1e-6)
    assert out.nsp_loss.item() == pytest.approx(nsp / 3, rel=1e-6)
    assert (out.nsp_correct.item(), out.nsp_count.item()) == (2.0, 3.0)
    assert out.loss.item() == pytest.approx(nll / (6 + 1e-5) + nsp / 3, rel=1e-6)


def test_all_zero_weights_give_zero_mlm_loss():
    m = crafted_model()
    with torch.no_grad():
        out = m(*batch([[3] * 3] * 3, [[0.0] * 3] * 3, [[1], [1], [1]]))
    assert out.mlm_loss.item() == 0.0 and out.mlm_weight.item() == 0.0
    assert out.nsp_loss.item() == pytest.approx(-math.log(0.2), rel=1e-6)


def test_padding_and_unmasked_positions_do_not_matter():
    """Tokens beyond input_mask, and labels at other positions, leave every output unchanged."""
    torch.manual_seed(0)
    m = BertForPreTraining(CFG).eval()
    ids, seg, mask, pos, lab, w, nsp = batch([[3, 7, 1]] * 3, [[1.0, 1.0, 1.0]] * 3, [[0], [1], [0]])
    mask[:, 6:] = 0
    with torch.no_grad():
        a = m(ids, seg, mask, pos, lab, w, nsp)
        ids2 = ids.clone()
        ids2[:, 6:] = (ids2[:, 6:] + 5) % 20
        b = m(ids2, seg, mask, pos, lab, w, nsp)
        seq_masked = m.bert(ids, seg, mask)[0]
        seq_full = m.bert(ids, seg, torch.ones_like(mask))[0]
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
    # The mask does act: unpadded positions see the padded ones once it is all ones.
    assert (seq_masked[:, :6] - seq_full[:, :6]).abs().max().item() > 1e-3


def test_dropout_only_in_training_and_gradients_flow():
    torch.manual_seed(0)
    m = BertForPreTraining(CFG)
    args = batch([[3, 7, 1]] * 3, [[1.0, 1.0, 1.0]] * 3, [[0], [1], [0]])
    m.eval()
    with torch.no_grad():
        e1, e2 = m(*args).loss, m(*args).loss
    assert e1.item() == e2.item()
    m.train()
    t1 = m(*args).loss
    t1.backward()
    assert t1.item() != e1.item()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_bf16_autocast_close_to_fp32():
    torch.manual_seed(0)
    m = BertForPreTraining(CFG).eval()
    args = batch([[3, 7, 1]] * 3, [[1.0, 1.0, 1.0]] * 3, [[0], [1], [0]])
    with torch.no_grad():
        ref = m(*args)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = m(*args)
    assert low.loss.dtype == torch.float32
    assert low.loss.item() == pytest.approx(ref.loss.item(), rel=2e-2)
