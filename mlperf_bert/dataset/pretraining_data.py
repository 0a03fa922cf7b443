"""create_pretraining_data: text shards -> BERT pre-training TFRecords, record for record the reference.

One ``random.Random(seed)`` drives everything in the reference's order (of its
``create_pretraining_data.py``).  Text files become a flat corpus of token ids (``_fasttok`` in C when built,
else ``FastTokenizer``).  The random draws and the per-instance work (pair truncation,
masking) live in a "kernel": ``_fastrng`` (C, when built) or ``PyKernel`` (pure Python);
both consume the Mersenne Twister stream identically.  The C kernel keeps the instances
compact and encodes their Examples in the final shuffled order as they are written
(``tfrecord.RecordStream``): a 27 MB shard takes ~160 MB, not the 505 MB of its records.
"""
import array
import contextlib
import os
import random
import sys

from mlperf_bert import flags
from mlperf_bert.errors import UserError
from mlperf_bert.dataset.native import fastrng
from mlperf_bert.dataset.example import check_shape, encode_pretraining_instance
from mlperf_bert.fileio import (check_writable_dir, ensure_space, new_dirs_removed_on_error,
                                refuse_overwriting_inputs, refuse_replacing_another_kind)
from mlperf_bert.locking import lock_files
from mlperf_bert.dataset.tfrecord import TFRecordWriter, expand_paths, frame
from mlperf_bert.dataset.tokenization import FastTokenizer, FullTokenizer, load_vocab

_fastrng = fastrng()  # the optional C accelerator (None: not built)


class PyKernel:
    """Pure-Python kernel: Python's own ``random.Random`` plus the per-instance steps.

    Same interface as ``_fastrng.Kernel``: ``set_corpus``, ``documents`` (instances kept in
    the kernel), ``shuffle_instances``, ``output_sizes``, ``encode_into``.
    """

    def __init__(self, seed, vocab_ids, cls_id, sep_id, mask_id, max_seq_length, max_predictions_per_seq):
        self._rng = random.Random(seed)
        self.random = self._rng.random
        self.randint = self._rng.randint
        self.shuffle = self._rng.shuffle
        self.vocab_ids = vocab_ids
        self.cls_id, self.sep_id, self.mask_id = cls_id, sep_id, mask_id
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        self.records = []  # framed records (no compact form needed on this path)
        self.max_record = 0

    @property
    def count(self):
        return len(self.records)

    def set_corpus(self, tokens, seg_off, doc_first, doc_stop):
        self.tokens, self.seg_off, self.doc_first, self.doc_stop = tokens, seg_off, doc_first, doc_stop

    def documents(self, start, stop, short_seq_prob, masked_lm_prob):
        for d in range(start, stop):
            self.document_instances(d, short_seq_prob, masked_lm_prob)
        return len(self.records)

    def document_instances(self, d, short_seq_prob, masked_lm_prob):
        """Reference create_instances_from_document for document ``d``.

        A chunk, tokens_a and tokens_b are always runs of consecutive segments, hence token
        ranges of the flat corpus: ``seg_off[s]`` is where segment ``s`` starts.
        """
        random_, randint = self.random, self.randint
        tokens, so = self.tokens, self.seg_off
        s0, s1 = self.doc_first[d], self.doc_stop[d]
        last_doc = len(self.doc_first) - 1
        max_num_tokens = self.max_seq_length - 3
        cls_, sep_ = [self.cls_id], [self.sep_id]
        target = max_num_tokens
        if random_() < short_seq_prob:
            target = randint(2, max_num_tokens)
        c0 = i = s0
        while i < s1:
            if i == s1 - 1 or so[i + 1] - so[c0] >= target:
                nchunk = i - c0 + 1
                a_end = 1 if nchunk < 2 else randint(1, nchunk - 1)
                a_lo, a_hi = so[c0], so[c0 + a_end]
                if nchunk == 1 or random_() < 0.5:
                    is_random_next = True
                    target_b = target - (a_hi - a_lo)
                    for _ in range(10):
                        r = randint(0, last_doc)
                        if r != d:
                            break
                    r0, r1 = self.doc_first[r], self.doc_stop[r]
                    j = r0 + randint(0, r1 - r0 - 1)
                    b_lo = so[j]
                    while True:  # whole segments until tokens_b reaches target_b
                        j += 1
                        b_hi = so[j]
                        if b_hi - b_lo >= target_b or j == r1:
                            break
                    i -= nchunk - a_end  # the chunk's unused segments go back
                else:
                    is_random_next = False
                    b_lo, b_hi = so[c0 + a_end], so[i + 1]
                a0, a1, b0, b1 = self.truncate(a_hi - a_lo, b_hi - b_lo, max_num_tokens)
                ids = (cls_ + tokens[a_lo + a0:a_lo + a1].tolist() + sep_
                       + tokens[b_lo + b0:b_lo + b1].tolist() + sep_)
                num_to_predict = min(self.max_predictions_per_seq,
                                     max(1, int(round(len(ids) * masked_lm_prob))))
                record = self.mask_encode(ids, a1 - a0, is_random_next, num_to_predict)
                self.records.append(record)
                self.max_record = max(self.max_record, len(record))
                c0 = i + 1
            i += 1

    def truncate(self, len_a, len_b, max_num_tokens):
        """Reference truncate_seq_pair on lengths: return (a_start, a_stop, b_start, b_stop)."""
        a0, a1, b0, b1 = 0, len_a, 0, len_b
        random_ = self.random
        while (a1 - a0) + (b1 - b0) > max_num_tokens:
            if a1 - a0 > b1 - b0:
                if random_() < 0.5:
                    a0 += 1
                else:
                    a1 -= 1
            else:
                if random_() < 0.5:
                    b0 += 1
                else:
                    b1 -= 1
        return a0, a1, b0, b1

    def mask_encode(self, tokens, len_a, is_random_next, num_to_predict):
        """Reference create_masked_lm_predictions on ids, then the Example as one framed TFRecord."""
        cls_id, sep_id = self.cls_id, self.sep_id
        cands = [i for i, t in enumerate(tokens) if t != cls_id and t != sep_id]
        self.shuffle(cands)
        output = list(tokens)
        random_, randint, vocab_ids = self.random, self.randint, self.vocab_ids
        last = len(vocab_ids) - 1
        picked = []
        for index in cands:
            if len(picked) >= num_to_predict:
                break
            if random_() < 0.8:
                output[index] = self.mask_id
            elif random_() < 0.5:
                pass  # keep the original token
            else:
                output[index] = vocab_ids[randint(0, last)]
            picked.append(index)
        picked.sort()
        return frame(encode_pretraining_instance(output, len_a + 2, picked, [tokens[i] for i in picked],
                                                 is_random_next, self.max_seq_length,
                                                 self.max_predictions_per_seq))

    def shuffle_instances(self):
        self.shuffle(self.records)

    def output_sizes(self, n_out):
        return [sum(map(len, self.records[w::n_out])) for w in range(n_out)]

    def encode_into(self, buffer, pos, step):
        """Framed records pos, pos+step, ... into ``buffer`` while they fit: (nbytes, next_pos)."""
        view, used, records = memoryview(buffer), 0, self.records
        while pos < len(records) and used + len(records[pos]) <= len(view):
            view[used:used + len(records[pos])] = records[pos]
            used += len(records[pos])
            pos += step
        if not used and pos < len(records):
            raise ValueError("buffer smaller than one record (see max_record)")
        return used, pos

    def clear(self):
        self.records = []


class _ReferenceIds(FullTokenizer):
    def __init__(self, vocab, do_lower_case, preserve_unused_tokens):
        super().__init__(vocab=vocab, do_lower_case=do_lower_case, preserve_unused_tokens=preserve_unused_tokens)

    def extend_ids(self, line, out):
        out += self.convert_tokens_to_ids(self.tokenize(line))


def make_kernel(seed, vocab_ids, cls_id, sep_id, mask_id, max_seq_length, max_predictions_per_seq,
                fast=None):
    """The C kernel when available (``fast=None``) or requested (``fast=True``), else PyKernel."""
    args = (vocab_ids, cls_id, sep_id, mask_id, max_seq_length, max_predictions_per_seq)
    if fast is None:
        fast = _fastrng is not None
    if fast:
        if _fastrng is None:
            raise RuntimeError("the C accelerator mlperf_bert.dataset._fastrng is not built")
        return _fastrng.Kernel(random.Random(seed).getstate()[1], *args)
    return PyKernel(seed, *args)


class Corpus:
    """Documents stored flat: segment ``s`` is ``tokens[seg_off[s]:seg_off[s+1]]``, document ``d``
    is segments ``[doc_seg[d], doc_seg[d+1])``.  Compact (4 bytes a token) for 27 MB shards."""

    def __init__(self):
        self.tokens = array.array("i")
        self.seg_off = array.array("q", [0])
        self.doc_seg = array.array("q", [0])

    def __len__(self):
        return len(self.doc_seg) - 1


def read_documents(input_files, tokenizer, progress=False, fast=None):
    """The reference's documents (non-empty runs of non-empty token lines) as a ``Corpus``.

    Lines are read as TF's GFile.readline reads them (split on "\\n" only, every "\\r" dropped: inside
    a line too) and stripped; an empty line
    starts a new document; documents continue across file boundaries; empty ones are dropped.
    ``fast``: None = the C tokenizer when the tokenizer has one, False = Python (same corpus).
    """
    corpus = Corpus()
    c_tok = tokenizer.corpus_tokenizer() if fast is not False and hasattr(tokenizer, "corpus_tokenizer") else None
    tokens = []  # Python path: a list grows faster than an array; converted once at the end
    total = sum(os.path.getsize(p) for p in input_files)
    with _bar(progress, total=total, unit="B", unit_scale=True, desc="tokenizing") as bar:
        for path in input_files:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise UserError("cannot read input file %s: %s" % (path, e.strerror or e))
            if b"\r" in data:  # "mid\rline": the reference reads "midline" (one word piece less or more)
                data = data.replace(b"\r", b"")
            if c_tok is not None:
                _feed(c_tok, path, data, bar)
            else:
                _read_lines(corpus, tokenizer, _decode(path, data), tokens, len(data), bar)
    if c_tok is not None:
        for name, (typecode, raw) in zip(("tokens", "seg_off", "doc_seg"), zip("iqq", c_tok.finish())):
            a = array.array(typecode)
            a.frombytes(raw)
            setattr(corpus, name, a)
        return corpus
    if corpus.doc_seg[-1] != len(corpus.seg_off) - 1:
        corpus.doc_seg.append(len(corpus.seg_off) - 1)
    corpus.tokens = array.array("i", tokens)
    return corpus


FEED_BYTES = 1 << 20  # text per C tokenizer call: progress and SIGTERM handled between calls


def _feed(c_tok, path, data, bar):
    view, start = memoryview(data), 0
    while start < len(data):
        stop = data.find(b"\n", min(len(data), start + FEED_BYTES))
        stop = len(data) if stop < 0 else stop + 1
        try:
            c_tok.feed(view[start:stop])
        except ValueError:  # invalid UTF-8: Python's decoder names the place
            _decode(path, data)
            raise
        bar.update(stop - start)
        start = stop


def _decode(path, data):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        from mlperf_bert.dataset.checksums import is_tfrecord
        from mlperf_bert.dataset.hdf5 import is_hdf5_file
        from mlperf_bert.fileio import compressed
        packed = compressed(path)
        if packed:
            raise UserError("input file " + packed)
        kind = "TFRecord" if is_tfrecord(path) else "HDF5" if is_hdf5_file(path) else None
        if kind:  # (a make-dataset output folder given for its input)
            raise UserError("input file %s is a %s file, not text: give the text shards (part-XXXXX-of-XXXXX)"
                            % (path, kind))
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError("input file %s is not UTF-8 text (line %d): convert it to UTF-8" % (path, line))


def _read_lines(corpus, tokenizer, text, tokens, size, bar):
    """Python path of ``read_documents`` for the text of one file."""
    seg_off, doc_seg = corpus.seg_off, corpus.doc_seg
    extend_ids = tokenizer.extend_ids
    lines = text.split("\n")
    del text
    if lines[-1] == "":
        lines.pop()  # readline() gives no empty line after a final newline
    step, shown = max(1, len(lines) // 50), 0  # ~50 progress updates a file
    for n, line in enumerate(lines):
        if n % step == 0 and n:
            bar.update(size * step // len(lines))
            shown += size * step // len(lines)
        line = line.strip()
        if not line:
            if doc_seg[-1] != len(seg_off) - 1:  # close a non-empty document
                doc_seg.append(len(seg_off) - 1)
            continue
        extend_ids(line, tokens)
        if len(tokens) != seg_off[-1]:
            seg_off.append(len(tokens))
    bar.update(size - shown)


def _bar(progress, **kwargs):
    if progress:
        from mlperf_bert.progress import bar
        return bar(**kwargs)
    return _NoBar()


class _NoBar:
    def update(self, n=1):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# The longest sequence the generator makes. Every record is padded to --max_seq_length tokens and the
# kernel takes 13 bytes a token at its start: 2,000,000,000 (allowed by check_shape, which the
# readers share) was a worker's MemoryError traceback. BERT's position embeddings take 512 (MLPerf's
# length), long-context BERTs a few thousand; to-hdf5 and pack store positions in 16 bits.
MAX_GENERATED_SEQ_LENGTH = 1 << 16


def check_settings(max_seq_length, max_predictions_per_seq, masked_lm_prob, dupe_factor, short_seq_prob):
    check_shape(max_seq_length, max_predictions_per_seq)
    if max_seq_length > MAX_GENERATED_SEQ_LENGTH:
        raise UserError("--max_seq_length=%d is longer than any BERT's sequences: give at most %d (MLPerf uses 512; "
                        "every record is padded to this length, and to-hdf5 and pack store positions in 16 bits)"
                        % (max_seq_length, MAX_GENERATED_SEQ_LENGTH))
    if not 0.0 <= masked_lm_prob <= 1.0:
        raise UserError("--masked_lm_prob=%g must be between 0 and 1" % masked_lm_prob)
    if not 0.0 <= short_seq_prob <= 1.0:
        raise UserError("--short_seq_prob=%g must be between 0 and 1" % short_seq_prob)
    if dupe_factor < 1:  # 0 wrote an output of no record, which looks finished
        raise UserError("--dupe_factor=%d must be at least 1 (each document is read that many times, with other "
                        "masks; MLPerf uses 10)" % dupe_factor)


def create_pretraining_data(input_files, output_files, vocab_file, do_lower_case=True,
                            max_seq_length=128, max_predictions_per_seq=20, masked_lm_prob=0.15,
                            random_seed=12345, dupe_factor=10, short_seq_prob=0.1, progress=True,
                            fast=None, reference_tokenizer=False, preserve_unused_tokens=False):
    """Write the reference's records for ``input_files`` round-robin to ``output_files``; return the count.

    ``input_files``/``output_files``: lists of paths or comma-separated strings (inputs may be globs).
    ``fast``: None = the C kernel and tokenizer if built, True/False to force (tests compare both).
    ``reference_tokenizer``: tokenize with the plain reference transcription (slow; for benchmarks).
    ``preserve_unused_tokens``: the reference's flag (tokenization.preserved_tokens).
    """
    # (a pipe of text, or of the vocab, is read once, as the reference reads it: --input_file=<(zcat
    # part.gz) and --vocab_file=<(unzip -p wheel vocab.txt) work)
    if isinstance(input_files, str):
        input_files = expand_paths(input_files, "input file", pipes=True)
    else:
        input_files = [p for spec in input_files for p in expand_paths(spec, "input file", pipes=True)]
    if isinstance(output_files, str):
        output_files = [p.strip() for p in output_files.split(",")]
        if len(output_files) > 1 and not all(output_files):
            # the reference fails on its writer of "" after the others; dropping it would split the
            # records over fewer files than were named
            raise UserError("--output_file=%s has an empty name (a comma with no file before or after it): "
                            "give the output files, comma-separated" % ",".join(output_files))
        output_files = [p for p in output_files if p]
    if not output_files:
        raise UserError("no output file given: set --output_file")
    if len(set(map(os.path.abspath, output_files))) != len(output_files):
        raise UserError("--output_file names a file twice: give distinct output files")
    check_settings(max_seq_length, max_predictions_per_seq, masked_lm_prob, dupe_factor, short_seq_prob)
    vocab = load_vocab(vocab_file)  # a missing or wrong vocab is refused before an output folder is made
    for path in output_files:
        if os.path.isdir(path):
            raise UserError("output file %s is a directory: give a file path such as %s/part-00000"
                            % (path, path.rstrip("/")))
    # An input refused once read (no document, a TFRecord given as text): the folders made go again.
    with new_dirs_removed_on_error(*(os.path.dirname(os.path.abspath(p)) for p in output_files)):
        for path in output_files:
            check_writable_dir(path)
        refuse_overwriting_inputs(output_files, input_files + [vocab_file], "--output_file")
        from mlperf_bert.dataset.checksums import is_tfrecord
        for p in output_files:
            refuse_replacing_another_kind(p, is_tfrecord, "a TFRecord file", "--output_file")
        with lock_files(output_files, "--output_file"):
            return _create(input_files, output_files, vocab, do_lower_case, max_seq_length,
                           max_predictions_per_seq, masked_lm_prob, random_seed, dupe_factor, short_seq_prob,
                           progress, fast, reference_tokenizer, preserve_unused_tokens)


def _create(input_files, output_files, vocab, do_lower_case, max_seq_length, max_predictions_per_seq,
            masked_lm_prob, random_seed, dupe_factor, short_seq_prob, progress, fast, reference_tokenizer,
            preserve_unused_tokens):
    if reference_tokenizer:
        tokenizer = _ReferenceIds(vocab, do_lower_case, preserve_unused_tokens)
    else:
        tokenizer = FastTokenizer(vocab=vocab, do_lower_case=do_lower_case,
                                  preserve_unused_tokens=preserve_unused_tokens)
    vocab_ids = [vocab[w] for w in vocab]  # reference vocab_words (first-seen order) as ids
    kernel = make_kernel(random_seed, vocab_ids, vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"],
                         max_seq_length, max_predictions_per_seq, fast)

    corpus = read_documents(input_files, tokenizer, progress, fast)
    n_docs = len(corpus)
    if not n_docs:
        raise UserError("input %s holds no documents (no line yields a token): give non-empty text "
                        "shards, one sentence per line" % ",".join(input_files))
    order = list(range(n_docs))
    kernel.shuffle(order)  # the same draws as shuffling the documents themselves
    doc_seg = corpus.doc_seg
    kernel.set_corpus(corpus.tokens, corpus.seg_off, array.array("q", [doc_seg[o] for o in order]),
                      array.array("q", [doc_seg[o + 1] for o in order]))
    del corpus

    with _bar(progress, total=dupe_factor * n_docs, unit="doc", desc="instances") as bar:
        for _ in range(dupe_factor):
            for start in range(0, n_docs, DOCS_PER_CALL):
                stop = min(n_docs, start + DOCS_PER_CALL)
                kernel.documents(start, stop, short_seq_prob, masked_lm_prob)
                bar.update(stop - start)
    kernel.shuffle_instances()
    try:
        return write_round_robin(kernel, output_files, progress)
    finally:
        kernel.clear()


DOCS_PER_CALL = 64  # documents per kernel call: a SIGTERM handler runs between calls


def write_round_robin(kernel, output_files, progress=False):
    """Write the kernel's instances as framed records, record k to output k % len(outputs),
    each file atomically; return the count."""
    n_out, count = len(output_files), kernel.count
    needed = dict(zip(output_files, kernel.output_sizes(n_out)))
    ensure_space(needed)  # all outputs at once: fail now, not after writing some of them
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(TFRecordWriter(p, needed[p])) for p in output_files]
        with _bar(progress, total=count, unit="rec", desc="writing") as bar:
            for w, writer in enumerate(writers):
                with writer.stream(kernel.max_record + 4) as out:
                    pos = w
                    while pos < count:
                        nbytes, nxt = kernel.encode_into(out.space(), pos, n_out)
                        done = len(range(pos, nxt, n_out))
                        out.commit(nbytes, done)
                        bar.update(done)
                        pos = nxt
    return count


def define_flags(fv):
    """The reference's flags, names and defaults."""
    flags.DEFINE_string("input_file", None, "Input raw text file (or comma-separated list of files).",
                        flag_values=fv)
    flags.DEFINE_string("output_file", None, "Output TF example file (or comma-separated list of files).",
                        flag_values=fv)
    flags.DEFINE_string("vocab_file", None, "The vocabulary file that the BERT model was trained on.",
                        flag_values=fv)
    flags.DEFINE_bool("do_lower_case", True, "Whether to lower case the input text.", flag_values=fv)
    flags.DEFINE_integer("max_seq_length", 128, "Maximum sequence length.", flag_values=fv)
    flags.DEFINE_integer("max_predictions_per_seq", 20, "Maximum number of masked LM predictions per sequence.",
                         flag_values=fv)
    flags.DEFINE_integer("random_seed", 12345, "Random seed for data generation.", flag_values=fv)
    flags.DEFINE_integer("dupe_factor", 10, "Number of times to duplicate the input data (with different masks).",
                         flag_values=fv)
    flags.DEFINE_float("masked_lm_prob", 0.15, "Masked LM probability.", flag_values=fv)
    flags.DEFINE_float("short_seq_prob", 0.1, "Probability of creating sequences shorter than the maximum length.",
                       flag_values=fv)
    flags.DEFINE_bool("preserve_unused_tokens", False, "Keep a whitespace token that is an [unusedN] token of the "
                      "vocab as that one token (not lower-cased, split or WordPiece'd).", flag_values=fv)


def main(argv):
    fv = flags.FlagValues()
    define_flags(fv)
    flags.parse(fv, argv, required=["input_file", "output_file", "vocab_file"], positional=False)
    n = create_pretraining_data(
        fv.input_file, fv.output_file, fv.vocab_file, do_lower_case=fv.do_lower_case,
        max_seq_length=fv.max_seq_length, max_predictions_per_seq=fv.max_predictions_per_seq,
        masked_lm_prob=fv.masked_lm_prob, random_seed=fv.random_seed, dupe_factor=fv.dupe_factor,
        short_seq_prob=fv.short_seq_prob, preserve_unused_tokens=fv.preserve_unused_tokens, progress=True)
    print("wrote %d records to %s" % (n, fv.output_file), file=sys.stderr)
    return 0
