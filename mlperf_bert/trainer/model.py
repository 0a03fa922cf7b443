"""BERT for pre-training, numerically the reference's (google BERT, TF1) in PyTorch.

Post-LN blocks, tanh GELU, LayerNorm eps 1e-12, additive -10000 attention mask (packed rows:
``attention``), pooler on [CLS], MLM head only at the gathered masked positions with tied word embeddings.
Module names mirror the TF variable names so ``tf_checkpoint`` maps them one to one.
"""
import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from mlperf_bert.trainer import attention

LN_EPS = 1e-12


def fp8_stacked(x, layers):
    """-> each of ``layers``' outputs of ``x``, by one float8 GEMM over their weights stacked
    [sum of out_features, in_features] (--fused_qkv with --fp8: x cast to float8 once, not once a
    layer, one GEMM of N = 3h where three of N = h ran, and one each for the input's and the weight's
    gradients). It is what torchao's ``Float8Linear.forward`` does for one layer, with the first
    layer's twin's config (every twin has the recipe's): its autograd function on the stacked
    weight, whose gradient autograd splits back into the three Parameters (the twins are
    levers.enable_fp8's). The row-wise recipe scales each weight row as the three layers do; the
    tensor-wise one scales the stacked weight by its one amax, where each layer had its own."""
    from torchao.float8.float8_linear import matmul_with_hp_or_float8_args
    twin = layers[0].fp8
    if torch.is_autocast_enabled():  # Float8Linear.forward's cast: the input in CUDA's autocast dtype
        x = x.to(torch.get_autocast_gpu_dtype())
    w = torch.cat([m.weight for m in layers])
    out = matmul_with_hp_or_float8_args.apply(x, w.t(), twin.linear_mm_config, twin.config)
    out = out + torch.cat([m.bias for m in layers]).to(out.dtype)
    return out.split([m.out_features for m in layers], dim=-1)


class PretrainingOutput(NamedTuple):
    loss: torch.Tensor          # mlm_loss + nsp_loss
    mlm_loss: torch.Tensor      # sum(w * nll) / (sum(w) + 1e-5)
    nsp_loss: torch.Tensor      # mean cross-entropy
    mlm_correct: Optional[torch.Tensor]  # sum(w * [argmax == label]); None in training mode (see forward)
    mlm_weight: torch.Tensor    # sum(w)
    mlm_nll_sum: torch.Tensor   # sum(w * nll)
    nsp_correct: Optional[torch.Tensor]  # number of correct NSP predictions; None in training mode
    nsp_count: torch.Tensor     # number of NSP examples
    nsp_nll_sum: torch.Tensor   # sum of NSP nll


class Linear(nn.Linear):
    """nn.Linear that, in training only, takes its float8 twin where --fp8 is on (the encoder's
    dense layers; torchao's Float8Linear on the same Parameters, trainer/levers.py). Without it
    it is nn.Linear, op for op."""

    fp8 = None

    def forward(self, x):
        if self.fp8 is not None and self.training:
            return self.fp8(x)
        return F.linear(x, self.weight, self.bias)


def gelu(x):
    return F.gelu(x, approximate="tanh")


def _linear(x):  # the reference's "linear" (and ""): no activation
    return x


def _activation(name):
    acts = {"gelu": gelu, "relu": F.relu, "tanh": torch.tanh, "linear": _linear}
    if name not in acts:
        raise ValueError("unsupported hidden_act %r" % name)
    return acts[name]


class Embeddings(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.word_embeddings = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.token_type_embeddings = nn.Parameter(torch.empty(cfg.type_vocab_size, cfg.hidden_size))
        self.position_embeddings = nn.Parameter(torch.empty(cfg.max_position_embeddings, cfg.hidden_size))
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=LN_EPS)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids, segment_ids, position_ids=None):
        seq = input_ids.shape[1]
        x = F.embedding(input_ids, self.word_embeddings)
        x = x + F.embedding(segment_ids, self.token_type_embeddings)
        if position_ids is None:
            x = x + self.position_embeddings[:seq].unsqueeze(0)
        else:  # packed rows: positions restart at each sequence
            x = x + F.embedding(position_ids, self.position_embeddings)
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    fused = False  # --fused_qkv

    def __init__(self, cfg):
        super().__init__()
        h = cfg.hidden_size
        self.query = Linear(h, h)
        self.key = Linear(h, h)
        self.value = Linear(h, h)
        self.heads = cfg.num_attention_heads
        self.p = cfg.attention_probs_dropout_prob

    def qkv(self, x):
        """(q, k, v) of x [b, t, h]: three GEMMs, or with --fused_qkv one over the three weights
        stacked [3h, h]. The parameters stay three either way: the reference's names in every
        checkpoint, and LAMB's trust ratio of each. Stacked after the cast to the compute dtype (the
        cast autocast makes of each anyway), so x is cast once where autocast casts it for each of
        the three (CUDA's autocast hands them LayerNorm's fp32 output). With --fp8 in training it is
        one float8 GEMM over the stacked weights (fp8_stacked), the bf16 one in eval."""
        layers = (self.query, self.key, self.value)
        if not self.fused:
            return tuple(m(x) for m in layers)
        if self.query.fp8 is not None and self.training:
            return fp8_stacked(x, layers)
        dtype = attention.compute_dtype(x.device, self.query.weight.dtype)
        w = torch.cat([m.weight.to(dtype) for m in layers])
        b = torch.cat([m.bias.to(dtype) for m in layers])
        return F.linear(x, w, b).split(self.query.out_features, dim=-1)


class AttentionOutput(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=LN_EPS)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self = SelfAttention(cfg)
        self.output = AttentionOutput(cfg)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, x, mask):
        s = self.self
        b, t, h = x.shape
        q, k, v = (y.view(b, t, s.heads, h // s.heads) for y in s.qkv(x))
        ctx = attention.attend(q, k, v, mask, s.p if self.training else 0.0, 1.0 / math.sqrt(h // s.heads))
        return self.output.LayerNorm(self.dropout(self.output.dense(ctx)) + x)


class Dense(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.dense = Linear(n_in, n_out)


class DenseLayerNorm(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.dense = Linear(n_in, n_out)
        self.LayerNorm = nn.LayerNorm(n_out, eps=LN_EPS)


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention = Attention(cfg)
        self.intermediate = Dense(cfg.hidden_size, cfg.intermediate_size)
        self.output = DenseLayerNorm(cfg.intermediate_size, cfg.hidden_size)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.act = _activation(cfg.hidden_act)

    def forward(self, x, mask):
        a = self.attention(x, mask)
        y = self.output.dense(self.act(self.intermediate.dense(a)))
        return self.output.LayerNorm(self.dropout(y) + a)


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.layer = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x, mask):
        for layer in self.layer:
            x = layer(x, mask)
        return x


class Bert(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embeddings = Embeddings(cfg)
        self.encoder = Encoder(cfg)
        self.pooler = Dense(cfg.hidden_size, cfg.hidden_size)
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads

    def forward(self, input_ids, segment_ids, input_mask, position_ids=None, nsp_positions=None):
        if position_ids is None:
            mask = attention.additive_mask(input_mask)
        else:  # packed rows: each sequence attends only to itself
            dtype = attention.compute_dtype(input_ids.device, self.pooler.dense.weight.dtype)
            mask = attention.packed_mask(input_mask, nsp_positions.shape[1], dtype, self.head_dim)
        seq = self.encoder(self.embeddings(input_ids, segment_ids, position_ids), mask)
        if nsp_positions is None:
            first = seq[:, 0]
        else:  # each sequence's first token: [b, K, h]
            first = seq.gather(1, nsp_positions[:, :, None].expand(-1, -1, seq.shape[-1]))
        pooled = torch.tanh(self.pooler.dense(first))
        return seq, pooled


class MLMHead(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.transform = DenseLayerNorm(cfg.hidden_size, cfg.hidden_size)
        self.output_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.act = _activation(cfg.hidden_act)


class NSPHead(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.output_weights = nn.Parameter(torch.empty(2, cfg.hidden_size))
        self.output_bias = nn.Parameter(torch.zeros(2))


class Cls(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.predictions = MLMHead(cfg)
        self.seq_relationship = NSPHead(cfg)


class BertForPreTraining(nn.Module):
    """BERT with the MLM and NSP heads; ``forward`` returns losses and exact metric sums."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.bert = Bert(config)
        self.cls = Cls(config)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """The reference's init: truncated normal (+-2 stddev) weights, zero biases, unit LayerNorm."""
        std = self.config.initializer_range
        for name, p in self.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):  # also LayerNorm beta and the heads' output_bias
                p.zero_()
            else:
                nn.init.trunc_normal_(p, std=std, a=-2 * std, b=2 * std)

    def forward(self, input_ids, segment_ids, input_mask, masked_lm_positions, masked_lm_ids,
                masked_lm_weights, next_sentence_labels, position_ids=None, nsp_positions=None,
                return_logits=False):
        """Losses and metric sums of a batch. Packed rows (dataset/packing.py) also give
        ``position_ids`` and ``nsp_positions``; their ``next_sentence_labels`` are -1 on empty
        slots, which do not count. The accuracy sums (``mlm_correct``, ``nsp_correct``) are the
        eval's, in eval mode; None in training mode, where no step reads them (the MLM one is an
        argmax over the vocabulary: as much work as the log_softmax on a CPU, a kernel more on a
        GPU, every micro-step). ``return_logits``: also (MLM logits [slots, vocab], NSP logits
        [sequences, 2]) of the counted slots and sequences."""
        seq, pooled = self.bert(input_ids, segment_ids, input_mask, position_ids, nsp_positions)
        b, t, h = seq.shape
        pred = self.cls.predictions

        # Gather the masked positions first: no logits over unmasked tokens.
        flat = (masked_lm_positions + torch.arange(b, device=seq.device)[:, None] * t).reshape(-1)
        x = seq.reshape(b * t, h).index_select(0, flat)
        x = pred.transform.LayerNorm(pred.act(pred.transform.dense(x)))
        # The weights as autocast gives them to the matmul; the biases in x's dtype (CUDA's
        # autocast keeps LayerNorm, so x, in fp32: its bias add and logits are fp32 there).
        logits = x @ self.bert.embeddings.word_embeddings.t()
        logits = logits + pred.output_bias.to(x.dtype)
        log_probs = F.log_softmax(logits.float(), dim=-1)
        labels = masked_lm_ids.reshape(-1)
        w = masked_lm_weights.reshape(-1).float()
        nll = -log_probs.gather(1, labels[:, None]).squeeze(1)
        mlm_nll_sum = (w * nll).sum()
        mlm_weight = w.sum()
        mlm_loss = mlm_nll_sum / (mlm_weight + 1e-5)
        # max's indices are argmax's (the first of equal maxima, NaN the maximum), in half the
        # time on a CPU
        mlm_correct = None if self.training else (w * (log_probs.max(-1).indices == labels).float()).sum()

        nsp = self.cls.seq_relationship
        pooled = pooled.reshape(-1, pooled.shape[-1])
        nsp_logits = pooled @ nsp.output_weights.t() + nsp.output_bias.to(pooled.dtype)
        nsp_log_probs = F.log_softmax(nsp_logits.float(), dim=-1)
        nsp_labels = next_sentence_labels.reshape(-1)
        # label -1 does not count: empty slots of packed rows, the eval's padding rows (x 1.0 is
        # exact, so real labels sum as they would alone)
        real = (nsp_labels >= 0).float()
        nsp_nll = -nsp_log_probs.gather(1, nsp_labels.clamp(min=0)[:, None]).squeeze(1)
        nsp_nll_sum = (real * nsp_nll).sum()
        nsp_count = real.sum()
        nsp_correct = None if self.training else (real * (nsp_log_probs.argmax(-1) == nsp_labels).float()).sum()
        nsp_loss = nsp_nll_sum / nsp_count
        out = PretrainingOutput(mlm_loss + nsp_loss, mlm_loss, nsp_loss, mlm_correct, mlm_weight,
                                mlm_nll_sum, nsp_correct, nsp_count, nsp_nll_sum)
        if return_logits:
            return out, (logits[w != 0], nsp_logits[nsp_labels >= 0])
        return out
