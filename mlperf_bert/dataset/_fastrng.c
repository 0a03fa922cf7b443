/* Optional C kernel of the pre-training data generator.
 *
 * Kernel reproduces Python's random.Random exactly (MT19937 seeded from
 * random.Random(seed).getstate(); getrandbits(k<=32) = top k bits of one word;
 * random() = two words; _randbelow = rejection on bit_length(n) bits), and does
 * the reference's per-instance steps (pair truncation, masking) without Python
 * objects per token.  Instances are kept compact (token ranges of the corpus plus
 * the masked positions and their output ids, ~600 bytes at seq 512 instead of a
 * 2.7 KB Example) and encoded as framed TFRecords only when written, in the order
 * of the final shuffle.  PyKernel in pretraining_data.py is the pure-Python twin;
 * tests check both give identical streams and bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#define MT_N 624
#define MT_M 397
#define BLOCK_BYTES (1 << 20)  /* instance storage grows by blocks: no large reallocs */

/* One instance: tokens_a = tokens[a_lo, a_lo+len_a), tokens_b = tokens[b_lo, b_lo+len_b);
 * followed by k int32 masked positions (increasing) and k int32 output ids. */
typedef struct {
    int64_t a_lo, b_lo;
    int32_t len_a, len_b;
    uint32_t k, ids_bytes, pos_bytes, lbl_bytes;  /* varint bytes of the three id lists */
    uint32_t is_random_next, framed;  /* framed: bytes of its TFRecord */
} Inst;

typedef struct {
    PyObject_HEAD
    uint32_t mt[MT_N];
    uint32_t out[MT_N + 1];  /* mt tempered: the next outputs are out[index:] */
    int index;
    long *vocab_ids;
    Py_ssize_t n_vocab;
    long cls_id, sep_id, mask_id;
    Py_ssize_t max_seq_length, max_pred;
    int32_t *tokens;
    int64_t *seg_off, *doc_first, *doc_stop;
    Py_ssize_t n_docs;
    int32_t *buf;           /* scratch: ids, candidates, output ids of one instance */
    uint32_t *vtab;         /* varint of v < n_vtab: bytes in the low 3 bytes, length in the top one */
    Py_ssize_t n_vtab;
    uint8_t *marks;         /* scratch: masked positions of one instance */
    char **blocks;          /* instance storage */
    Py_ssize_t n_blocks;
    size_t block_used;
    Inst **inst;            /* instances in creation order, then in shuffled order */
    Py_ssize_t n_inst, cap_inst;
    Py_ssize_t max_record;  /* largest framed record so far */
} Kernel;

static void refill(Kernel *k)
{
    static const uint32_t mag01[2] = {0x0U, 0x9908b0dfU};
    uint32_t y, *mt = k->mt;
    int kk;
    for (kk = 0; kk < MT_N - MT_M; kk++) {
        y = (mt[kk] & 0x80000000U) | (mt[kk + 1] & 0x7fffffffU);
        mt[kk] = mt[kk + MT_M] ^ (y >> 1) ^ mag01[y & 1U];
    }
    for (; kk < MT_N - 1; kk++) {
        y = (mt[kk] & 0x80000000U) | (mt[kk + 1] & 0x7fffffffU);
        mt[kk] = mt[kk + (MT_M - MT_N)] ^ (y >> 1) ^ mag01[y & 1U];
    }
    y = (mt[MT_N - 1] & 0x80000000U) | (mt[0] & 0x7fffffffU);
    mt[MT_N - 1] = mt[MT_M - 1] ^ (y >> 1) ^ mag01[y & 1U];
    k->index = 0;
}

/* Temper mt[from:] into out[from:]; a loop the compiler vectorizes. */
static void temper(Kernel *k, int from)
{
    for (int i = from; i < MT_N; i++) {
        uint32_t y = k->mt[i];
        y ^= (y >> 11);
        y ^= (y << 7) & 0x9d2c5680U;
        y ^= (y << 15) & 0xefc60000U;
        y ^= (y >> 18);
        k->out[i] = y;
    }
}

static inline uint32_t genrand(Kernel *k)
{
    if (__builtin_expect(k->index >= MT_N, 0)) {
        refill(k);
        temper(k, 0);
    }
    return k->out[k->index++];
}

static inline double rand_double(Kernel *k)
{
    uint32_t a = genrand(k) >> 5, b = genrand(k) >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

/* Python's _randbelow_with_getrandbits for 1 <= n < 2**32. */
static inline uint32_t randbelow(Kernel *k, uint64_t n)
{
    int shift = __builtin_clzll(n) - 32;  /* 32 - bit_length(n) */
    if (__builtin_expect(k->index < MT_N - 1, 1)) {
        /* two words at once: the first rejection costs a conditional move, not a mispredicted
         * branch (a third of the shuffle's draws are rejected) */
        uint32_t r0 = k->out[k->index] >> shift, r1 = k->out[k->index + 1] >> shift;
        int ok0 = r0 < n;
        if (ok0 | (r1 < n)) {
            k->index += 2 - ok0;
            return ok0 ? r0 : r1;
        }
        k->index += 2;
    }
    uint32_t r = genrand(k) >> shift;
    while (r >= n)
        r = genrand(k) >> shift;
    return r;
}

/* The draws of random.shuffle on n < 2**31 items: js[i] = randbelow(i + 1) for i = n-1 ... 1.
 * A word is taken, or rejected and the next one tried, for the same i; taking every word in
 * turn and stepping i only when a word is taken keeps the loop free of branches on the draws
 * (the rejection branch would be mispredicted a third of the time). */
static void shuffle_draws(Kernel *k, Py_ssize_t n, int32_t *js)
{
    if (n < 2)
        return;
    uint32_t i = (uint32_t)(n - 1);
    while (i > 0) {
        int bits = 32 - __builtin_clz(i + 1), shift = 32 - bits;
        uint32_t low = (1U << (bits - 1)) - 1;  /* randbelow(i + 1) keeps bit_length(i + 1) down to i = low */
        if (low < 1)
            low = 1;
        if (k->index >= MT_N) {
            refill(k);
            temper(k, 0);
        }
        const uint32_t *out = k->out;
        int idx = k->index;
        while (idx < MT_N && i >= low) {
            uint32_t r = out[idx++] >> shift;
            js[i] = (int32_t)r;
            i -= r <= i;  /* r < i + 1: taken */
        }
        k->index = idx;
    }
}

static int check_width(uint64_t n)
{
    if (n == 0 || n > 0xffffffffULL) {
        PyErr_SetString(PyExc_ValueError, "range width must be between 1 and 2**32-1");
        return -1;
    }
    return 0;
}

static void free_instances(Kernel *self)
{
    for (Py_ssize_t b = 0; b < self->n_blocks; b++)
        PyMem_Free(self->blocks[b]);
    PyMem_Free(self->blocks);
    PyMem_Free(self->inst);
    self->blocks = NULL;
    self->inst = NULL;
    self->n_blocks = self->n_inst = self->cap_inst = 0;
    self->block_used = 0;
    self->max_record = 0;
}

static void Kernel_dealloc(Kernel *self)
{
    free_instances(self);
    PyMem_Free(self->vocab_ids);
    PyMem_Free(self->tokens);
    PyMem_Free(self->seg_off);
    PyMem_Free(self->doc_first);
    PyMem_Free(self->doc_stop);
    PyMem_Free(self->buf);
    PyMem_Free(self->marks);
    PyMem_Free(self->vtab);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static long *long_array(PyObject *seq, Py_ssize_t *n_out, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    long *a = PyMem_Malloc((n ? n : 1) * sizeof(long));
    if (!a) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        a[i] = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (a[i] == -1 && PyErr_Occurred()) {
            PyMem_Free(a);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    *n_out = n;
    return a;
}

static int make_vtab(Kernel *self);

static int Kernel_init(Kernel *self, PyObject *args, PyObject *kw)
{
    PyObject *state, *vocab;
    if (!PyArg_ParseTuple(args, "OOlllnn", &state, &vocab, &self->cls_id, &self->sep_id,
                          &self->mask_id, &self->max_seq_length, &self->max_pred))
        return -1;
    if (self->max_seq_length < 5 || self->max_seq_length > 0x7fffffff || self->max_pred < 0
        || self->max_pred > self->max_seq_length) {
        PyErr_SetString(PyExc_ValueError, "need 5 <= max_seq_length < 2**31, 0 <= max_predictions <= it");
        return -1;
    }
    Py_ssize_t n;
    long *st = long_array(state, &n, "state must be a sequence");
    if (!st)
        return -1;
    if (n != MT_N + 1 || st[MT_N] < 0 || st[MT_N] > MT_N) {
        PyMem_Free(st);
        PyErr_SetString(PyExc_ValueError, "state must be random.Random().getstate()[1]");
        return -1;
    }
    for (int i = 0; i < MT_N; i++)
        self->mt[i] = (uint32_t)st[i];
    self->index = (int)st[MT_N];
    temper(self, 0);
    PyMem_Free(st);
    PyMem_Free(self->vocab_ids);
    self->vocab_ids = long_array(vocab, &self->n_vocab, "vocab_ids must be a sequence");
    if (!self->vocab_ids)
        return -1;
    if (self->n_vocab < 1 || check_width((uint64_t)self->n_vocab) < 0)
        return -1;
    PyMem_Free(self->buf);
    PyMem_Free(self->marks);
    self->buf = PyMem_Malloc(sizeof(int32_t) * 3 * (self->max_seq_length + 1));
    self->marks = PyMem_Malloc(self->max_seq_length + 1);
    if (!self->buf || !self->marks) {
        PyErr_NoMemory();
        return -1;
    }
    free_instances(self);
    return make_vtab(self);
}

static PyObject *Kernel_random(Kernel *self, PyObject *unused)
{
    return PyFloat_FromDouble(rand_double(self));
}

static PyObject *Kernel_randint(Kernel *self, PyObject *args)
{
    long long a, b;
    if (!PyArg_ParseTuple(args, "LL", &a, &b))
        return NULL;
    if (b < a) {
        PyErr_Format(PyExc_ValueError, "empty range for randint(%lld, %lld)", a, b);
        return NULL;
    }
    uint64_t width = (uint64_t)(b - a) + 1;
    if (check_width(width) < 0)
        return NULL;
    return PyLong_FromLongLong(a + (long long)randbelow(self, width));
}

static PyObject *Kernel_shuffle(Kernel *self, PyObject *x)
{
    if (!PyList_Check(x)) {
        PyErr_SetString(PyExc_TypeError, "shuffle needs a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(x);
    if (n > 0x7fffffff) {
        PyErr_SetString(PyExc_ValueError, "shuffle of more than 2**31-1 items");
        return NULL;
    }
    int32_t *js = PyMem_Malloc(sizeof(int32_t) * (n > 1 ? n : 1));
    if (!js)
        return PyErr_NoMemory();
    shuffle_draws(self, n, js);
    PyObject **items = ((PyListObject *)x)->ob_item;
    for (Py_ssize_t i = n - 1; i > 0; i--) {
        PyObject *t = items[i];
        items[i] = items[js[i]];
        items[js[i]] = t;
    }
    PyMem_Free(js);
    Py_RETURN_NONE;
}

static PyObject *Kernel_getstate(Kernel *self, PyObject *unused)
{
    PyObject *t = PyTuple_New(MT_N + 1);
    if (!t)
        return NULL;
    for (int i = 0; i < MT_N; i++)
        PyTuple_SET_ITEM(t, i, PyLong_FromUnsignedLong(self->mt[i]));
    PyTuple_SET_ITEM(t, MT_N, PyLong_FromLong(self->index));
    return t;
}

/* CRC-32C (Castagnoli) for TFRecord framing: SSE4.2 when the CPU has it, else slicing-by-8. */
static uint32_t crc_table[8][256];
static int have_sse42;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int j = 0; j < 8; j++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78U : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2")))
static uint32_t crc_hw(const uint8_t *p, size_t n)
{
    uint64_t c = 0xffffffffU;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
    }
    uint32_t c32 = (uint32_t)c;
    for (; n; n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
#endif

static uint32_t crc32c(const uint8_t *p, size_t n)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_sse42)
        return crc_hw(p, n);
#endif
    uint32_t c = 0xffffffffU;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff]
            ^ crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]]
            ^ crc_table[0][p[7]];
    }
    for (; n; n--)
        c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

static void put_masked_crc(uint8_t *dst, const uint8_t *p, size_t n)
{
    uint32_t c = crc32c(p, n);
    c = ((c >> 15) | (c << 17)) + 0xa282ead8U;
    for (int i = 0; i < 4; i++)
        dst[i] = (uint8_t)(c >> (8 * i));
}

/* Varint length and writer, without data-dependent branches for values below 2**21 (token
 * ids mix 2- and 3-byte varints unpredictably). */
static inline int vlen(uint64_t v)
{
    if (__builtin_expect(v < (1U << 21), 1))
        return 1 + (v >= 0x80) + (v >= 0x4000);
    int n = 3;
    for (v >>= 21; v; v >>= 7) n++;
    return n;
}

static inline uint8_t *putv(uint8_t *p, uint64_t v)
{
    if (__builtin_expect(v < (1U << 21), 1)) {
        uint32_t two = v >= 0x80, three = v >= 0x4000;
        uint32_t w = ((uint32_t)v & 0x7f) | two << 7 | ((uint32_t)(v >> 7) & 0x7f) << 8 | three << 15
                     | (uint32_t)(v >> 14) << 16;
        memcpy(p, &w, 4);  /* callers leave 4 bytes of room: later fields overwrite the spare */
        return p + 1 + two + three;
    }
    while (v > 0x7f) { *p++ = (uint8_t)((v & 0x7f) | 0x80); v >>= 7; }
    *p++ = (uint8_t)v;
    return p;
}

/* The varint table: ids and positions below 2**21 (all of them with a BERT vocab). */
static int make_vtab(Kernel *self)
{
    long top = self->max_seq_length;
    for (Py_ssize_t i = 0; i < self->n_vocab; i++)
        if (self->vocab_ids[i] > top)
            top = self->vocab_ids[i];
    if (self->cls_id > top) top = self->cls_id;
    if (self->sep_id > top) top = self->sep_id;
    if (self->mask_id > top) top = self->mask_id;
    PyMem_Free(self->vtab);
    self->vtab = NULL;
    self->n_vtab = 0;
    if (top >= (1L << 21))
        return 0;  /* putv for every value */
    self->vtab = PyMem_Malloc(sizeof(uint32_t) * (top + 1));
    if (!self->vtab) {
        PyErr_NoMemory();
        return -1;
    }
    for (long v = 0; v <= top; v++) {
        uint8_t b[8] = {0};
        uint32_t e;
        int n = (int)(putv(b, (uint64_t)v) - b);
        memcpy(&e, b, 4);
        self->vtab[v] = (e & 0xffffff) | (uint32_t)n << 24;
    }
    self->n_vtab = top + 1;
    return 0;
}

static inline int id_len(const Kernel *self, int64_t v)
{
    return (uint64_t)v < (uint64_t)self->n_vtab ? (int)(self->vtab[v] >> 24) : vlen((uint64_t)v);
}

static inline uint8_t *put_id(const Kernel *self, uint8_t *p, int64_t v)
{
    if ((uint64_t)v < (uint64_t)self->n_vtab) {
        uint32_t e = self->vtab[v];
        memcpy(p, &e, 4);  /* as putv: 4 bytes of room */
        return p + (e >> 24);
    }
    return putv(p, (uint64_t)v);
}

enum { F_IDS, F_MASK, F_SEG, F_POS, F_LBL, F_W, F_NSL, F_COUNT };
static const char *FEATURE_NAMES[F_COUNT] = {"input_ids", "input_mask", "segment_ids",
    "masked_lm_positions", "masked_lm_ids", "masked_lm_weights", "next_sentence_labels"};
static const Py_ssize_t NAME_LEN[F_COUNT] = {9, 10, 11, 19, 13, 17, 20};

/* Byte sizes of the Example of an instance: payloads plen, Feature contents flen, map entries
 * elen; returns the serialized Example's length. */
static Py_ssize_t layout(const Kernel *self, const Inst *in, Py_ssize_t plen[F_COUNT],
                         Py_ssize_t flen[F_COUNT], Py_ssize_t elen[F_COUNT])
{
    Py_ssize_t L = self->max_seq_length, P = self->max_pred, total = 0;
    Py_ssize_t n = in->len_a + in->len_b + 3, k = in->k;
    plen[F_IDS] = L - n + in->ids_bytes;
    plen[F_MASK] = plen[F_SEG] = L;
    plen[F_POS] = P - k + in->pos_bytes;
    plen[F_LBL] = P - k + in->lbl_bytes;
    plen[F_W] = 4 * P;
    plen[F_NSL] = 1;
    for (int f = 0; f < F_COUNT; f++) {
        Py_ssize_t inner = plen[f] ? 1 + vlen(plen[f]) + plen[f] : 0;
        Py_ssize_t nl = NAME_LEN[f];
        flen[f] = inner;
        Py_ssize_t feature = 1 + vlen(inner) + inner;
        elen[f] = 1 + vlen(nl) + nl + 1 + vlen(feature) + feature;
        total += 1 + vlen(elen[f]) + elen[f];
    }
    return total;
}

static Py_ssize_t framed_size(const Kernel *self, const Inst *in)
{
    Py_ssize_t plen[F_COUNT], flen[F_COUNT], elen[F_COUNT];
    Py_ssize_t total = layout(self, in, plen, flen, elen);
    return 12 + 1 + vlen(total) + total + 4;
}

/* The ids [CLS] a [SEP] b [SEP] of an instance into ids; returns their count. */
static Py_ssize_t instance_ids(const Kernel *self, int64_t a_lo, Py_ssize_t len_a, int64_t b_lo,
                               Py_ssize_t len_b, int32_t *ids)
{
    ids[0] = (int32_t)self->cls_id;
    memcpy(ids + 1, self->tokens + a_lo, len_a * sizeof(int32_t));
    ids[len_a + 1] = (int32_t)self->sep_id;
    memcpy(ids + len_a + 2, self->tokens + b_lo, len_b * sizeof(int32_t));
    ids[len_a + len_b + 2] = (int32_t)self->sep_id;
    return len_a + len_b + 3;
}

static Inst *new_inst(Kernel *self, Py_ssize_t k)
{
    size_t need = (sizeof(Inst) + 8 * (size_t)k + 7) & ~(size_t)7;
    if (self->n_inst == self->cap_inst) {
        Py_ssize_t cap = self->cap_inst ? 2 * self->cap_inst : 4096;
        Inst **p = PyMem_Realloc(self->inst, cap * sizeof(Inst *));
        if (!p)
            return (Inst *)PyErr_NoMemory();
        self->inst = p;
        self->cap_inst = cap;
    }
    if (!self->n_blocks || self->block_used + need > BLOCK_BYTES) {
        size_t size = need > BLOCK_BYTES ? need : BLOCK_BYTES;
        char **b = PyMem_Realloc(self->blocks, (self->n_blocks + 1) * sizeof(char *));
        if (!b)
            return (Inst *)PyErr_NoMemory();
        self->blocks = b;
        if (!(b[self->n_blocks] = PyMem_Malloc(size)))
            return (Inst *)PyErr_NoMemory();
        self->n_blocks++;
        self->block_used = 0;
    }
    Inst *in = (Inst *)(self->blocks[self->n_blocks - 1] + self->block_used);
    self->block_used += need;
    self->inst[self->n_inst++] = in;
    return in;
}

/* Reference create_masked_lm_predictions on the instance's ids; stores it compactly. */
static int mask_store(Kernel *self, int64_t a_lo, Py_ssize_t len_a, int64_t b_lo, Py_ssize_t len_b,
                      int is_random_next, double masked_lm_prob)
{
    int32_t *ids = self->buf, *cands = ids + self->max_seq_length + 1, *outid = cands + self->max_seq_length + 1;
    uint8_t *chosen = self->marks;
    Py_ssize_t n = instance_ids(self, a_lo, len_a, b_lo, len_b, ids);
    Py_ssize_t num_to_predict = (Py_ssize_t)nearbyint((double)n * masked_lm_prob);
    if (num_to_predict < 1) num_to_predict = 1;
    if (num_to_predict > self->max_pred) num_to_predict = self->max_pred;
    Py_ssize_t nc = 0, ids_bytes = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        ids_bytes += id_len(self, ids[i]);
        if (ids[i] != self->cls_id && ids[i] != self->sep_id)
            cands[nc++] = i;
    }
    shuffle_draws(self, nc, outid);
    for (Py_ssize_t i = nc - 1; i > 0; i--) {
        int32_t j = outid[i], t = cands[i];
        cands[i] = cands[j];
        cands[j] = t;
    }
    /* chosen[index] = 1 at a masked position, outid[index] its output id */
    memset(chosen, 0, (size_t)n & 0xffffffffU);  /* n <= max_seq_length < 2**31 */
    Py_ssize_t k = 0;
    for (Py_ssize_t c = 0; c < nc && k < num_to_predict; c++, k++) {
        int32_t index = cands[c];
        long id = ids[index];
        if (rand_double(self) < 0.8)
            id = self->mask_id;
        else if (rand_double(self) < 0.5)
            ; /* keep the original token */
        else
            id = self->vocab_ids[randbelow(self, (uint64_t)self->n_vocab)];
        chosen[index] = 1;
        outid[index] = (int32_t)id;
    }
    Inst *in = new_inst(self, k);
    if (!in)
        return -1;
    in->a_lo = a_lo;
    in->b_lo = b_lo;
    in->len_a = (int32_t)len_a;
    in->len_b = (int32_t)len_b;
    in->k = (uint32_t)k;
    in->is_random_next = is_random_next;
    int32_t *pos = (int32_t *)(in + 1), *out = pos + k;
    Py_ssize_t c = 0, pos_bytes = 0, lbl_bytes = 0;
    for (Py_ssize_t i = 0; i < n; i++) {  /* positions in increasing order, branch-free */
        cands[c] = (int32_t)i;
        c += chosen[i];
    }
    for (c = 0; c < k; c++) {
        int32_t i = cands[c];
        pos[c] = i;
        out[c] = outid[i];
        pos_bytes += id_len(self, i);
        lbl_bytes += id_len(self, ids[i]);
        ids_bytes += id_len(self, outid[i]) - id_len(self, ids[i]);
    }
    in->ids_bytes = (uint32_t)ids_bytes;
    in->pos_bytes = (uint32_t)pos_bytes;
    in->lbl_bytes = (uint32_t)lbl_bytes;
    Py_ssize_t size = framed_size(self, in);
    if (size > 0xffffffffLL) {
        PyErr_SetString(PyExc_OverflowError, "record larger than 4 GB");
        return -1;
    }
    in->framed = (uint32_t)size;
    if (size > self->max_record)
        self->max_record = size;
    return 0;
}

/* The framed TFRecord of instance in at dst (framed_size(in) bytes). */
static void encode(const Kernel *self, const Inst *in, uint8_t *head)
{
    Py_ssize_t L = self->max_seq_length, P = self->max_pred;
    Py_ssize_t plen[F_COUNT], flen[F_COUNT], elen[F_COUNT];
    Py_ssize_t total = layout(self, in, plen, flen, elen);
    Py_ssize_t data_len = 1 + vlen(total) + total, k = in->k;
    const int32_t *pos = (const int32_t *)(in + 1), *out = pos + k;
    int32_t *ids = self->buf, *labels = ids + self->max_seq_length + 1;
    Py_ssize_t n = instance_ids(self, in->a_lo, in->len_a, in->b_lo, in->len_b, ids);
    for (Py_ssize_t c = 0; c < k; c++) {  /* the masked tokens become labels, their outputs go in */
        labels[c] = ids[pos[c]];
        ids[pos[c]] = out[c];
    }
    Py_ssize_t num_a = in->len_a + 2;
    uint8_t *data = head + 12, *p = data;
    for (int i = 0; i < 8; i++)
        head[i] = (uint8_t)((uint64_t)data_len >> (8 * i));
    put_masked_crc(head + 8, head, 8);
    *p++ = 0x0a;
    p = putv(p, total);
    for (int f = 0; f < F_COUNT; f++) {
        Py_ssize_t nl = NAME_LEN[f];
        Py_ssize_t inner = flen[f];
        *p++ = 0x0a;
        p = putv(p, elen[f]);
        *p++ = 0x0a;
        p = putv(p, nl);
        memcpy(p, FEATURE_NAMES[f], nl);
        p += nl;
        *p++ = 0x12;
        p = putv(p, 1 + vlen(inner) + inner);
        *p++ = f == F_W ? 0x12 : 0x1a;
        p = putv(p, inner);
        if (!plen[f])
            continue;
        *p++ = 0x0a;
        p = putv(p, plen[f]);
        switch (f) {
        case F_IDS:
            for (Py_ssize_t i = 0; i < n; i++)
                p = put_id(self, p, ids[i]);
            memset(p, 0, L - n);
            p += L - n;
            break;
        case F_MASK:
            memset(p, 1, n);
            memset(p + n, 0, L - n);
            p += L;
            break;
        case F_SEG:
            memset(p, 0, num_a);
            memset(p + num_a, 1, n - num_a);
            memset(p + n, 0, L - n);
            p += L;
            break;
        case F_POS:
        case F_LBL:
            for (Py_ssize_t i = 0; i < k; i++)
                p = put_id(self, p, f == F_POS ? pos[i] : labels[i]);
            memset(p, 0, P - k);
            p += P - k;
            break;
        case F_W: {
            static const uint8_t one[4] = {0x00, 0x00, 0x80, 0x3f}; /* 1.0f little-endian */
            for (Py_ssize_t i = 0; i < k; i++, p += 4)
                memcpy(p, one, 4);
            memset(p, 0, 4 * (P - k));
            p += 4 * (P - k);
            break;
        }
        case F_NSL:
            *p++ = in->is_random_next ? 1 : 0;
            break;
        }
    }
    put_masked_crc(p, data, data_len);
}

static int copy_buffer(PyObject *obj, int itemsize, void **dst, Py_ssize_t *n, const char *what)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view.itemsize != itemsize) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_TypeError, "%s must hold %d-byte integers", what, itemsize);
        return -1;
    }
    PyMem_Free(*dst);
    *dst = PyMem_Malloc(view.len ? view.len : 1);
    if (!*dst) {
        PyBuffer_Release(&view);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(*dst, view.buf, view.len);
    *n = view.len / itemsize;
    PyBuffer_Release(&view);
    return 0;
}

/* set_corpus(tokens int32, seg_off int64, doc_first int64, doc_stop int64): the documents,
 * flat; segment s is tokens[seg_off[s]:seg_off[s+1]], document d is segments
 * [doc_first[d], doc_stop[d]) in the (shuffled) order the instances are made. */
static PyObject *Kernel_set_corpus(Kernel *self, PyObject *args)
{
    PyObject *t, *so, *df, *ds;
    Py_ssize_t nt, ns, nd, nd2;
    if (!PyArg_ParseTuple(args, "OOOO", &t, &so, &df, &ds))
        return NULL;
    self->n_docs = 0;
    if (copy_buffer(t, 4, (void **)&self->tokens, &nt, "tokens") < 0
        || copy_buffer(so, 8, (void **)&self->seg_off, &ns, "seg_off") < 0
        || copy_buffer(df, 8, (void **)&self->doc_first, &nd, "doc_first") < 0
        || copy_buffer(ds, 8, (void **)&self->doc_stop, &nd2, "doc_stop") < 0)
        return NULL;
    if (nd != nd2 || nd < 1) {
        PyErr_SetString(PyExc_ValueError, "doc_first and doc_stop must be equally long, non-empty");
        return NULL;
    }
    for (Py_ssize_t d = 0; d < nd; d++)
        if (self->doc_first[d] < 0 || self->doc_stop[d] <= self->doc_first[d] || self->doc_stop[d] >= ns) {
            PyErr_SetString(PyExc_ValueError, "bad document bounds");
            return NULL;
        }
    for (Py_ssize_t s = 0; s + 1 < ns; s++)
        if (self->seg_off[s] < 0 || self->seg_off[s + 1] <= self->seg_off[s] || self->seg_off[s + 1] > nt) {
            PyErr_SetString(PyExc_ValueError, "bad segment offsets");
            return NULL;
        }
    self->n_docs = nd;
    Py_RETURN_NONE;
}

/* Reference create_instances_from_document for document d.  A chunk, tokens_a and
 * tokens_b are always runs of consecutive segments, so they are token ranges of the
 * flat corpus. */
static int document_instances(Kernel *self, Py_ssize_t d, double short_seq_prob, double masked_lm_prob)
{
    const int64_t *so = self->seg_off;
    Py_ssize_t max_num = self->max_seq_length - 3;
    Py_ssize_t s0 = self->doc_first[d], s1 = self->doc_stop[d];
    Py_ssize_t target = max_num;
    if (rand_double(self) < short_seq_prob)
        target = 2 + randbelow(self, (uint64_t)(max_num - 1));
    Py_ssize_t c0 = s0;
    for (Py_ssize_t i = s0; i < s1; i++) {
        if (!(i == s1 - 1 || so[i + 1] - so[c0] >= target))
            continue;
        Py_ssize_t nchunk = i - c0 + 1;
        Py_ssize_t a_end = nchunk < 2 ? 1 : 1 + randbelow(self, (uint64_t)(nchunk - 1));
        int64_t a_lo = so[c0], a_hi = so[c0 + a_end], b_lo, b_hi;
        int is_random_next;
        if (nchunk == 1 || rand_double(self) < 0.5) {
            is_random_next = 1;
            int64_t target_b = target - (a_hi - a_lo);
            Py_ssize_t r = 0;
            for (int t = 0; t < 10; t++) {
                r = randbelow(self, (uint64_t)self->n_docs);
                if (r != d)
                    break;
            }
            Py_ssize_t r1 = self->doc_stop[r];
            Py_ssize_t j = self->doc_first[r] + randbelow(self, (uint64_t)(r1 - self->doc_first[r]));
            b_lo = so[j];
            do {
                b_hi = so[++j];
            } while (b_hi - b_lo < target_b && j < r1);
            i -= nchunk - a_end;
        } else {
            is_random_next = 0;
            b_lo = so[c0 + a_end];
            b_hi = so[i + 1];
        }
        /* truncate_seq_pair */
        while ((a_hi - a_lo) + (b_hi - b_lo) > max_num) {
            int front = rand_double(self) < 0.5;
            if (a_hi - a_lo > b_hi - b_lo) {
                if (front) a_lo++; else a_hi--;
            } else {
                if (front) b_lo++; else b_hi--;
            }
        }
        if (mask_store(self, a_lo, a_hi - a_lo, b_lo, b_hi - b_lo, is_random_next, masked_lm_prob) < 0)
            return -1;
        c0 = i + 1;
    }
    return 0;
}

/* documents(start, stop, short_seq_prob, masked_lm_prob) -> instances so far: the
 * instances of documents [start, stop), kept in the kernel. */
static PyObject *Kernel_documents(Kernel *self, PyObject *args)
{
    Py_ssize_t start, stop;
    double short_seq_prob, masked_lm_prob;
    if (!PyArg_ParseTuple(args, "nndd", &start, &stop, &short_seq_prob, &masked_lm_prob))
        return NULL;
    if (!self->n_docs || start < 0 || stop > self->n_docs || start > stop) {
        PyErr_SetString(PyExc_IndexError, "no corpus set or document range out of range");
        return NULL;
    }
    for (Py_ssize_t d = start; d < stop; d++)
        if (document_instances(self, d, short_seq_prob, masked_lm_prob) < 0)
            return NULL;
    return PyLong_FromSsize_t(self->n_inst);
}

/* shuffle_instances(): rng.shuffle(instances), the reference's last draw. */
static PyObject *Kernel_shuffle_instances(Kernel *self, PyObject *unused)
{
    Inst **x = self->inst;
    Py_ssize_t n = self->n_inst;
    if (n > 0x7fffffff) {
        PyErr_SetString(PyExc_ValueError, "more than 2**31-1 instances");
        return NULL;
    }
    int32_t *js = PyMem_Malloc(sizeof(int32_t) * (n > 1 ? n : 1));
    if (!js)
        return PyErr_NoMemory();
    shuffle_draws(self, n, js);
    for (Py_ssize_t i = n - 1; i > 0; i--) {
        Inst *t = x[i];
        x[i] = x[js[i]];
        x[js[i]] = t;
    }
    PyMem_Free(js);
    Py_RETURN_NONE;
}

/* output_sizes(n_out) -> bytes of the framed records k, k+n_out, ... for each output k. */
static PyObject *Kernel_output_sizes(Kernel *self, PyObject *arg)
{
    Py_ssize_t n_out = PyLong_AsSsize_t(arg);
    if (n_out == -1 && PyErr_Occurred())
        return NULL;
    if (n_out < 1) {
        PyErr_SetString(PyExc_ValueError, "n_out must be positive");
        return NULL;
    }
    PyObject *list = PyList_New(n_out);
    if (!list)
        return NULL;
    for (Py_ssize_t w = 0; w < n_out; w++) {
        long long sum = 0;
        for (Py_ssize_t i = w; i < self->n_inst; i += n_out)
            sum += self->inst[i]->framed;
        PyObject *v = PyLong_FromLongLong(sum);
        if (!v) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, w, v);
    }
    return list;
}

/* encode_into(buffer, pos, step) -> (nbytes, next_pos): framed records pos, pos+step, ...
 * of the instances (in their current order) into the writable buffer, as many as fit. */
static PyObject *Kernel_encode_into(Kernel *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, step;
    if (!PyArg_ParseTuple(args, "w*nn", &view, &pos, &step))
        return NULL;
    if (pos < 0 || step < 1) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "pos must be >= 0 and step >= 1");
        return NULL;
    }
    uint8_t *dst = view.buf;
    Py_ssize_t used = 0;
    for (; pos < self->n_inst; pos += step) {
        if (pos + step < self->n_inst) {  /* the next record's instance and tokens: random places */
            const Inst *next = self->inst[pos + step];
            __builtin_prefetch(next + 1);
            __builtin_prefetch(self->tokens + next->a_lo);
            __builtin_prefetch(self->tokens + next->b_lo);
        }
        if (pos + 2 * step < self->n_inst)
            __builtin_prefetch(self->inst[pos + 2 * step]);
        Py_ssize_t size = self->inst[pos]->framed;
        if (used + size + 4 > view.len)  /* putv may write 3 spare bytes past the record */
            break;
        encode(self, self->inst[pos], dst + used);
        used += size;
    }
    PyBuffer_Release(&view);
    if (!used && pos < self->n_inst) {
        PyErr_SetString(PyExc_ValueError, "buffer smaller than one record (see max_record)");
        return NULL;
    }
    return Py_BuildValue("nn", used, pos);
}

static PyObject *Kernel_clear(Kernel *self, PyObject *unused)
{
    free_instances(self);
    Py_RETURN_NONE;
}

/* ---- Batch decoder of pre-training Examples (any feature order) ---- */

typedef struct { const uint8_t *p, *end; } Cursor;

static int read_varint(Cursor *c, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (c->p >= c->end)
            return -1;
        uint8_t b = *c->p++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return 0;
        }
    }
    return -1;
}

/* Next field of a message: its number, wire type, and for wire 2 the payload cursor,
 * for wire 0 the value. 1 = a field, 0 = end, -1 = malformed. */
static int next_field(Cursor *c, int *num, int *wire, Cursor *sub, uint64_t *val)
{
    uint64_t key, n;
    if (c->p >= c->end)
        return 0;
    if (read_varint(c, &key) < 0)
        return -1;
    *num = (int)(key >> 3);
    *wire = (int)(key & 7);
    switch (*wire) {
    case 0:
        return read_varint(c, val) < 0 ? -1 : 1;
    case 1:
    case 5: {
        size_t w = *wire == 1 ? 8 : 4;
        if ((size_t)(c->end - c->p) < w)
            return -1;
        sub->p = c->p;
        sub->end = c->p + w;
        c->p += w;
        return 1;
    }
    case 2:
        if (read_varint(c, &n) < 0 || n > (uint64_t)(c->end - c->p))
            return -1;
        sub->p = c->p;
        sub->end = c->p + n;
        c->p += n;
        return 1;
    }
    return -1;
}

/* An int64 value into dst[i] (when i < cap); -1, with the value in *wide, when it does not fit
 * int32: wrapped, 2**32 + 5 would train as token 5. */
static inline int put_int32(int32_t *dst, Py_ssize_t i, Py_ssize_t cap, uint64_t v, int64_t *wide)
{
    int64_t s = (int64_t)v;  /* int64 values are two's complement in 64 bits */
    if (s < INT32_MIN || s > INT32_MAX) {
        *wide = s;
        return -1;
    }
    if (i < cap)
        dst[i] = (int32_t)s;
    return 0;
}

/* Values of one Feature into dst (int32 or float32); returns their count, -1 if malformed, or
 * -2 for an int64 value outside int32 (in *wide). */
static Py_ssize_t feature_values(Cursor feature, int is_float, void *dst, Py_ssize_t cap, int *kind,
                                 int64_t *wide)
{
    Cursor lst, item;
    int num, wire, r;
    uint64_t v;
    Py_ssize_t count = 0;
    *kind = 0;
    while ((r = next_field(&feature, &num, &wire, &lst, &v)) == 1) {
        if (wire != 2)
            continue;
        *kind = num;
        if (num != (is_float ? 2 : 3))
            continue;
        while ((r = next_field(&lst, &num, &wire, &item, &v)) == 1) {
            if (num != 1)
                continue;
            if (is_float) {
                if (wire != 2 && wire != 5)
                    return -1;
                for (const uint8_t *q = item.p; q + 4 <= item.end; q += 4, count++)
                    if (count < cap)
                        memcpy((float *)dst + count, q, 4);
                if ((item.end - item.p) % 4)
                    return -1;
            } else if (wire == 0) {
                if (put_int32(dst, count++, cap, v, wide) < 0)
                    return -2;
            } else if (wire == 2) {
                while (item.p < item.end) {
                    if (read_varint(&item, &v) < 0)
                        return -1;
                    if (put_int32(dst, count++, cap, v, wide) < 0)
                        return -2;
                }
            } else {
                return -1;
            }
        }
        if (r < 0)
            return -1;
    }
    return r < 0 ? -1 : count;
}

/* Why decode_batch refuses a record: ValueError(record index, one of these, feature index or -1,
 * a number: the kind found (0 = none, 1 bytes, 2 float, 3 int64), the count, or the value). */
enum { E_MALFORMED, E_KIND, E_LENGTH, E_RANGE };

/* decode_batch(records, max_seq_length, max_predictions_per_seq) -> 7 bytearrays
 * (int32 / float32 rows, in PRETRAINING_FEATURES order); example.py words its errors. */
static PyObject *decode_batch(PyObject *module, PyObject *args)
{
    PyObject *records;
    Py_ssize_t L, P;
    if (!PyArg_ParseTuple(args, "Onn", &records, &L, &P))
        return NULL;
    PyObject *fast = PySequence_Fast(records, "records must be a sequence of bytes");
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Py_ssize_t width[F_COUNT] = {L, L, L, P, P, P, 1};
    PyObject *outs[F_COUNT] = {NULL};
    char *buf[F_COUNT];
    PyObject *result = NULL;
    for (int f = 0; f < F_COUNT; f++) {
        outs[f] = PyByteArray_FromStringAndSize(NULL, 4 * width[f] * n);  /* writable arrays */
        if (!outs[f])
            goto done;
        buf[f] = PyByteArray_AS_STRING(outs[f]);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer view;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), &view, PyBUF_SIMPLE) < 0)
            goto done;
        Cursor ex = {view.buf, (const uint8_t *)view.buf + view.len}, feats, entry, x, name, feature;
        int num, wire, r = 0, r2 = 0, seen[F_COUNT] = {0};
        uint64_t v;
        int err = -1, bad_f = -1;
        long long number = 0;
        while (err < 0 && (r = next_field(&ex, &num, &wire, &feats, &v)) == 1) {
            if (num != 1 || wire != 2)
                continue;
            while (err < 0 && (r2 = next_field(&feats, &num, &wire, &entry, &v)) == 1) {
                if (num != 1 || wire != 2)
                    continue;
                int have_name = 0, have_feature = 0;
                while ((r = next_field(&entry, &num, &wire, &x, &v)) == 1) {
                    if (wire != 2)
                        continue;
                    if (num == 1) { name = x; have_name = 1; }
                    else if (num == 2) { feature = x; have_feature = 1; }
                }
                if (r < 0) { err = E_MALFORMED; break; }
                if (!have_name)
                    continue;
                for (int f = 0; f < F_COUNT; f++) {
                    size_t nl = strlen(FEATURE_NAMES[f]);
                    if ((size_t)(name.end - name.p) != nl || memcmp(name.p, FEATURE_NAMES[f], nl))
                        continue;
                    int kind = 0;
                    int64_t wide = 0;
                    Py_ssize_t count = 0;
                    if (have_feature)
                        count = feature_values(feature, f == F_W, buf[f] + 4 * width[f] * i, width[f], &kind,
                                               &wide);
                    if (count == -1) { err = E_MALFORMED; break; }
                    bad_f = f;
                    if (count == -2) { err = E_RANGE; number = wide; break; }
                    if (kind != (f == F_W ? 2 : 3)) { err = E_KIND; number = kind; break; }
                    if (count != width[f]) { err = E_LENGTH; number = count; break; }
                    seen[f] = 1;
                }
            }
            if (r2 < 0 && err < 0) err = E_MALFORMED;
        }
        if (r < 0 && err < 0) err = E_MALFORMED;
        PyBuffer_Release(&view);
        for (int f = 0; f < F_COUNT && err < 0; f++)
            if (!seen[f]) { err = E_KIND; bad_f = f; number = 0; }
        if (err >= 0) {
            PyObject *why = Py_BuildValue("(niiL)", i, err, err == E_MALFORMED ? -1 : bad_f, number);
            if (why) {
                PyErr_SetObject(PyExc_ValueError, why);
                Py_DECREF(why);
            }
            goto done;
        }
    }
    result = PyTuple_New(F_COUNT);
    if (result)
        for (int f = 0; f < F_COUNT; f++) {
            PyTuple_SET_ITEM(result, f, outs[f]);
            outs[f] = NULL;
        }
done:
    for (int f = 0; f < F_COUNT; f++)
        Py_XDECREF(outs[f]);
    Py_DECREF(fast);
    return result;
}

static PyMethodDef module_methods[] = {
    {"decode_batch", decode_batch, METH_VARARGS,
     "decode_batch(records, max_seq_length, max_predictions_per_seq) -> 7 bytearrays of int32/float32 rows"},
    {NULL}
};

static PyMethodDef Kernel_methods[] = {
    {"random", (PyCFunction)Kernel_random, METH_NOARGS, "random.Random.random()"},
    {"randint", (PyCFunction)Kernel_randint, METH_VARARGS, "random.Random.randint(a, b)"},
    {"shuffle", (PyCFunction)Kernel_shuffle, METH_O, "random.Random.shuffle(list)"},
    {"getstate", (PyCFunction)Kernel_getstate, METH_NOARGS, "the 624 words and index"},
    {"set_corpus", (PyCFunction)Kernel_set_corpus, METH_VARARGS,
     "set_corpus(tokens, seg_off, doc_first, doc_stop): the flat documents"},
    {"documents", (PyCFunction)Kernel_documents, METH_VARARGS,
     "documents(start, stop, short_seq_prob, masked_lm_prob) -> instances so far"},
    {"shuffle_instances", (PyCFunction)Kernel_shuffle_instances, METH_NOARGS,
     "shuffle_instances(): rng.shuffle of the instances"},
    {"output_sizes", (PyCFunction)Kernel_output_sizes, METH_O,
     "output_sizes(n_out) -> framed bytes of each round-robin output"},
    {"encode_into", (PyCFunction)Kernel_encode_into, METH_VARARGS,
     "encode_into(buffer, pos, step) -> (nbytes, next_pos): framed records pos, pos+step, ..."},
    {"clear", (PyCFunction)Kernel_clear, METH_NOARGS, "drop the instances"},
    {NULL}
};

static PyObject *Kernel_get_count(Kernel *self, void *c) { return PyLong_FromSsize_t(self->n_inst); }
static PyObject *Kernel_get_max_record(Kernel *self, void *c) { return PyLong_FromSsize_t(self->max_record); }

static PyGetSetDef Kernel_getset[] = {
    {"count", (getter)Kernel_get_count, NULL, "instances made so far", NULL},
    {"max_record", (getter)Kernel_get_max_record, NULL, "bytes of the largest framed record", NULL},
    {NULL}
};

static PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mlperf_bert._fastrng.Kernel",
    .tp_basicsize = sizeof(Kernel),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Kernel(state, vocab_ids, cls_id, sep_id, mask_id, max_seq_length, max_predictions_per_seq)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Kernel_init,
    .tp_dealloc = (destructor)Kernel_dealloc,
    .tp_methods = Kernel_methods,
    .tp_getset = Kernel_getset,
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_fastrng", "C kernel of the pre-training data generator.", -1, module_methods
};

PyMODINIT_FUNC PyInit__fastrng(void)
{
    crc_init();
    if (PyType_Ready(&KernelType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&KernelType);
    if (PyModule_AddObject(m, "Kernel", (PyObject *)&KernelType) < 0) {
        Py_DECREF(&KernelType);
        Py_DECREF(m);
        return NULL;
    }
    /* native.FASTRNG_VERSION: a module built from older sources is refused, not misread */
    if (PyModule_AddIntConstant(m, "VERSION", 2) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
