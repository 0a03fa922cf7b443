/* Optional C tokenizer of the pre-training data generator: text shards -> the flat corpus.
 *
 * Gives FastTokenizer's ids (tokenization.py), which are the reference tokenizer's:
 * lines split on "\n", a line of whitespace only ends a document, every other line is
 * cleaned and split into whitespace tokens by a per-code-point class that Python computes
 * once per code point (what the reference's clean-text / CJK spacing / str.split() do
 * with it), and each whitespace token's ids are memoised by its UTF-8 bytes.  A token
 * seen for the first time is lowered, split on punctuation and WordPiece'd here when it is
 * ASCII, and by FastTokenizer._word_ids (Python) otherwise.  Invalid UTF-8 is refused
 * exactly where Python's strict decoder refuses it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Code point classes (bit flags); 0 = not asked yet. */
#define C_KNOWN 0x80
#define C_SPACE 0x10   /* str.isspace(): stripped, a line of these is empty */
#define C_KIND 0x07
enum { K_DROP = 1, K_SEP = 2, K_ALONE = 3, K_WORD = 4 };
#define MAX_CP 0x110000
#define MAX_INPUT_CHARS_PER_WORD 200

/* ---- byte-string -> int32 ids hash map (open addressing, power-of-two slots) ----
 * A slot is half a cache line and holds keys up to 8 bytes and up to 2 ids itself: most
 * lookups of a word touch one slot and nothing else. */

typedef struct {
    uint64_t key8;       /* the key's first 8 bytes, zero padded */
    uint32_t tag;        /* high hash bits | 1; 0 = empty slot */
    uint32_t key_off;    /* the key's bytes after the 8th, in the keys arena */
    uint32_t key_len, val_len;
    union {
        int32_t ids[2];  /* val_len <= 2 */
        uint32_t off;    /* else in the vals arena */
    } v;
} Slot;

typedef struct {
    Slot *slots;
    size_t cap, used;
    uint8_t *keys;
    size_t keys_len, keys_cap;
    int32_t *vals;
    size_t vals_len, vals_cap;
} Map;

typedef struct {
    uint64_t h, key8;
} Key;

static inline Key hash_key(const uint8_t *p, size_t n)
{
    Key k;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0xff51afd7ed558ccdULL), v = 0;
    memcpy(&v, p, n < 8 ? n : 8);
    k.key8 = v;
    h = (h ^ v) * 0x94d049bb133111ebULL;
    h ^= h >> 29;
    for (size_t i = 8; i < n; i += 8) {
        v = 0;
        memcpy(&v, p + i, n - i < 8 ? n - i : 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 31;
    }
    h *= 0xc4ceb9fe1a85ec53ULL;
    k.h = h ^ (h >> 32);
    return k;
}

static void map_free(Map *m)
{
    PyMem_Free(m->slots);
    PyMem_Free(m->keys);
    PyMem_Free(m->vals);
    memset(m, 0, sizeof(*m));
}

static int map_init(Map *m, size_t cap)
{
    memset(m, 0, sizeof(*m));
    m->cap = cap;
    m->slots = PyMem_Calloc(cap, sizeof(Slot));
    if (!m->slots) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The slot holding the key, or the empty slot where it would go. */
static inline Slot *map_find(const Map *m, const uint8_t *key, size_t n, Key k)
{
    size_t mask = m->cap - 1, i = k.h & mask;
    uint32_t tag = (uint32_t)(k.h >> 32) | 1;
    for (;;) {
        Slot *s = &m->slots[i];
        if (!s->tag)
            return s;
        if (s->tag == tag && s->key8 == k.key8 && s->key_len == n
            && (n <= 8 || !memcmp(m->keys + s->key_off, key + 8, n - 8)))
            return s;
        i = (i + 1) & mask;
    }
}

static inline const int32_t *slot_ids(const Map *m, const Slot *s)
{
    return s->val_len <= 2 ? s->v.ids : m->vals + s->v.off;
}

static int grow(void **buf, size_t *cap, size_t need, size_t item)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    void *p = PyMem_Realloc(*buf, c * item);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = p;
    *cap = c;
    return 0;
}

static int map_rehash(Map *m)
{
    size_t cap = m->cap * 2;
    Slot *slots = PyMem_Calloc(cap, sizeof(Slot));
    if (!slots) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        Slot *s = &m->slots[i];
        if (!s->tag)
            continue;
        /* the slot index came from the hash's low bits, which the slot does not keep */
        const uint8_t *tail = m->keys + s->key_off;
        uint8_t key[8 + 4096], *full = key;
        if (s->key_len > sizeof(key) && !(full = PyMem_Malloc(s->key_len))) {
            PyMem_Free(slots);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(full, &s->key8, 8);
        if (s->key_len > 8)
            memcpy(full + 8, tail, s->key_len - 8);
        size_t j = hash_key(full, s->key_len).h & (cap - 1);
        if (full != key)
            PyMem_Free(full);
        while (slots[j].tag)
            j = (j + 1) & (cap - 1);
        slots[j] = *s;
    }
    PyMem_Free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

/* Insert key -> vals (the key must be absent). */
static Slot *map_put(Map *m, const uint8_t *key, size_t n, Key k, const int32_t *vals, size_t nv)
{
    if ((m->used + 1) * 4 > m->cap * 3 && map_rehash(m) < 0)
        return NULL;
    if (n > 0xffffffffU || nv > 0xffffffffU || m->keys_len + n > 0xffffffffU || m->vals_len + nv > 0xffffffffU) {
        PyErr_SetString(PyExc_OverflowError, "tokenizer memo larger than 4 GB");
        return NULL;
    }
    if ((n > 8 && grow((void **)&m->keys, &m->keys_cap, m->keys_len + n - 8, 1) < 0)
        || (nv > 2 && grow((void **)&m->vals, &m->vals_cap, m->vals_len + nv, sizeof(int32_t)) < 0))
        return NULL;
    Slot *s = map_find(m, key, n, k);
    s->tag = (uint32_t)(k.h >> 32) | 1;
    s->key8 = k.key8;
    s->key_len = (uint32_t)n;
    s->val_len = (uint32_t)nv;
    s->key_off = (uint32_t)m->keys_len;
    if (n > 8) {
        memcpy(m->keys + m->keys_len, key + 8, n - 8);
        m->keys_len += n - 8;
    }
    if (nv > 2) {
        s->v.off = (uint32_t)m->vals_len;
        memcpy(m->vals + m->vals_len, vals, nv * sizeof(int32_t));
        m->vals_len += nv;
    } else {
        memcpy(s->v.ids, vals, nv * sizeof(int32_t));
    }
    m->used++;
    return s;
}

/* ---- the tokenizer ---- */

typedef struct {
    PyObject_HEAD
    Map vocab, memo;
    int32_t unk_id;
    size_t max_len;          /* longest vocab entry in bytes */
    int lower;
    PyObject *classify, *word_ids;
    uint8_t *cls;            /* MAX_CP code point classes */
    uint8_t *word, *piece;   /* scratch: the words of a line end to end; a piece */
    size_t word_cap, piece_cap;
    size_t *wend;            /* scratch: where each word of the line ends in word */
    Key *wkey;
    size_t wend_cap, wkey_cap;
    int32_t *ids;            /* scratch ids of one token */
    size_t ids_cap;
    int32_t *tokens;         /* the corpus */
    int64_t *seg_off, *doc_seg;
    size_t n_tokens, tokens_cap, n_seg, seg_cap, n_doc, doc_cap;
} Tokenizer;

static void Tokenizer_dealloc(Tokenizer *self)
{
    map_free(&self->vocab);
    map_free(&self->memo);
    Py_XDECREF(self->classify);
    Py_XDECREF(self->word_ids);
    PyMem_Free(self->cls);
    PyMem_Free(self->word);
    PyMem_Free(self->piece);
    PyMem_Free(self->wend);
    PyMem_Free(self->wkey);
    PyMem_Free(self->ids);
    PyMem_Free(self->tokens);
    PyMem_Free(self->seg_off);
    PyMem_Free(self->doc_seg);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int push_seg(Tokenizer *self, int64_t v)
{
    if (grow((void **)&self->seg_off, &self->seg_cap, self->n_seg + 1, sizeof(int64_t)) < 0)
        return -1;
    self->seg_off[self->n_seg++] = v;
    return 0;
}

static int push_doc(Tokenizer *self, int64_t v)
{
    if (grow((void **)&self->doc_seg, &self->doc_cap, self->n_doc + 1, sizeof(int64_t)) < 0)
        return -1;
    self->doc_seg[self->n_doc++] = v;
    return 0;
}

static int Tokenizer_init(Tokenizer *self, PyObject *args, PyObject *kw)
{
    PyObject *vocab, *classify, *word_ids;
    int unk, lower;
    if (!PyArg_ParseTuple(args, "O!ipOO", &PyDict_Type, &vocab, &unk, &lower, &classify, &word_ids))
        return -1;
    if (self->cls) {
        PyErr_SetString(PyExc_RuntimeError, "Tokenizer.__init__ called twice");
        return -1;
    }
    self->unk_id = unk;
    self->lower = lower;
    Py_INCREF(classify);
    self->classify = classify;
    Py_INCREF(word_ids);
    self->word_ids = word_ids;
    self->cls = PyMem_Calloc(MAX_CP, 1);
    if (!self->cls) {
        PyErr_NoMemory();
        return -1;
    }
    size_t cap = 1024;
    while (cap < 2 * (size_t)PyDict_GET_SIZE(vocab))
        cap *= 2;
    if (map_init(&self->vocab, cap) < 0 || map_init(&self->memo, 1 << 16) < 0)
        return -1;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(vocab, &pos, &key, &value)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(key, &n);
        if (!s)
            return -1;
        long id = PyLong_AsLong(value);
        if (id == -1 && PyErr_Occurred())
            return -1;
        int32_t v = (int32_t)id;
        Key k = hash_key((const uint8_t *)s, n);
        if (map_find(&self->vocab, (const uint8_t *)s, n, k)->tag)
            continue;  /* a dict has each key once; kept for safety */
        if (!map_put(&self->vocab, (const uint8_t *)s, n, k, &v, 1))
            return -1;
        if ((size_t)n > self->max_len)
            self->max_len = n;
    }
    if (push_seg(self, 0) < 0 || push_doc(self, 0) < 0)
        return -1;
    return 0;
}

static int class_of(Tokenizer *self, uint32_t cp)
{
    int c = self->cls[cp];
    if (c)
        return c;
    PyObject *r = PyObject_CallFunction(self->classify, "I", cp);
    if (!r)
        return -1;
    long v = PyLong_AsLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (!(v & C_KIND) || (v & C_KIND) > K_WORD) {
        PyErr_Format(PyExc_ValueError, "classify(%u) returned %ld", cp, v);
        return -1;
    }
    self->cls[cp] = (uint8_t)(v | C_KNOWN);
    return self->cls[cp];
}

static int push_ids(Tokenizer *self, const int32_t *v, size_t n)
{
    if (grow((void **)&self->tokens, &self->tokens_cap, self->n_tokens + n, sizeof(int32_t)) < 0)
        return -1;
    memcpy(self->tokens + self->n_tokens, v, n * sizeof(int32_t));
    self->n_tokens += n;
    return 0;
}

static int add_id(Tokenizer *self, size_t *n, int32_t id)
{
    if (grow((void **)&self->ids, &self->ids_cap, *n + 1, sizeof(int32_t)) < 0)
        return -1;
    self->ids[(*n)++] = id;
    return 0;
}

static inline int is_alnum(uint8_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Reference WordPiece of one ASCII basic token (greedy longest match first). */
static int wordpiece(Tokenizer *self, const uint8_t *p, size_t n, size_t *nids)
{
    if (n > MAX_INPUT_CHARS_PER_WORD)
        return add_id(self, nids, self->unk_id);
    if (grow((void **)&self->piece, &self->piece_cap, n + 2, 1) < 0)
        return -1;
    uint8_t *sub = self->piece;
    size_t start = 0, first = *nids;
    sub[0] = sub[1] = '#';
    while (start < n) {
        size_t end = n - start > self->max_len ? start + self->max_len : n;
        Slot *found = NULL;
        for (; start < end; end--) {
            const uint8_t *key = p + start;
            size_t len = end - start;
            if (start > 0) {
                memcpy(sub + 2, p + start, len);
                key = sub;
                len += 2;
            }
            Slot *s = map_find(&self->vocab, key, len, hash_key(key, len));
            if (s->tag) {
                found = s;
                break;
            }
        }
        if (!found) {
            *nids = first;
            return add_id(self, nids, self->unk_id);
        }
        if (add_id(self, nids, found->v.ids[0]) < 0)
            return -1;
        start = end;
    }
    return 0;
}

/* Ids of a whitespace token seen for the first time, memoised. */
static Slot *new_word(Tokenizer *self, const uint8_t *w, size_t n, Key h)
{
    size_t nids = 0, ascii = 1;
    for (size_t i = 0; i < n; i++)
        ascii &= w[i] < 0x80;
    if (ascii) {
        /* lowering is context-free, nothing to strip, punctuation = every non-alphanumeric */
        if (grow((void **)&self->piece, &self->piece_cap, n + 2, 1) < 0)
            return NULL;
        uint8_t *low = PyMem_Malloc(n ? n : 1);
        if (!low) {
            PyErr_NoMemory();
            return NULL;
        }
        for (size_t i = 0; i < n; i++)
            low[i] = self->lower && w[i] >= 'A' && w[i] <= 'Z' ? w[i] + 32 : w[i];
        int err = 0;
        for (size_t i = 0; i < n && !err;) {
            size_t j = i + 1;
            if (is_alnum(low[i]))
                while (j < n && is_alnum(low[j]))
                    j++;
            err = wordpiece(self, low + i, j - i, &nids) < 0;
            i = j;
        }
        PyMem_Free(low);
        if (err)
            return NULL;
    } else {
        PyObject *r = PyObject_CallFunction(self->word_ids, "s#", (const char *)w, (Py_ssize_t)n);
        if (!r)
            return NULL;
        PyObject *fast = PySequence_Fast(r, "word_ids must return a sequence");
        Py_DECREF(r);
        if (!fast)
            return NULL;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
            long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
            if ((v == -1 && PyErr_Occurred()) || add_id(self, &nids, (int32_t)v) < 0) {
                Py_DECREF(fast);
                return NULL;
            }
        }
        Py_DECREF(fast);
    }
    return map_put(&self->memo, w, n, h, self->ids, nids);
}

/* The ids of word w (n bytes, hash k) onto the corpus. */
static int word_ids(Tokenizer *self, const uint8_t *w, size_t n, Key k)
{
    Slot *s = map_find(&self->memo, w, n, k);
    if (!s->tag && !(s = new_word(self, w, n, k)))
        return -1;
    return push_ids(self, slot_ids(&self->memo, s), s->val_len);
}

/* Length of the valid UTF-8 sequence at p (< end) and its code point; 0 if invalid
 * (the strict decoder's rules: no overlongs, no surrogates, nothing above U+10FFFF). */
static inline int utf8_next(const uint8_t *p, const uint8_t *end, uint32_t *cp)
{
    uint8_t b = p[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    if (b < 0xc2)
        return 0;
    if (b < 0xe0) {
        if (end - p < 2 || (p[1] & 0xc0) != 0x80)
            return 0;
        *cp = ((uint32_t)(b & 0x1f) << 6) | (p[1] & 0x3f);
        return 2;
    }
    if (b < 0xf0) {
        if (end - p < 3 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80)
            return 0;
        if ((b == 0xe0 && p[1] < 0xa0) || (b == 0xed && p[1] > 0x9f))
            return 0;
        *cp = ((uint32_t)(b & 0x0f) << 12) | ((uint32_t)(p[1] & 0x3f) << 6) | (p[2] & 0x3f);
        return 3;
    }
    if (b < 0xf5) {
        if (end - p < 4 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80 || (p[3] & 0xc0) != 0x80)
            return 0;
        if ((b == 0xf0 && p[1] < 0x90) || (b == 0xf4 && p[1] > 0x8f))
            return 0;
        *cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(p[1] & 0x3f) << 12)
              | ((uint32_t)(p[2] & 0x3f) << 6) | (p[3] & 0x3f);
        return 4;
    }
    return 0;
}

#define WORD_BATCH 256  /* words looked up together */

/* The ids of the words gathered in word (ends in wend, hashes in wkey) onto the corpus. */
static int flush_words(Tokenizer *self, size_t nw)
{
    for (size_t i = 0, from = 0; i < nw; from = self->wend[i++])
        if (word_ids(self, self->word + from, self->wend[i] - from, self->wkey[i]) < 0)
            return -1;
    return 0;
}

/* One line (without its "\n"): a document boundary, nothing, or a segment.  Words are
 * gathered a batch at a time and their memo slots prefetched, then looked up: the lookups
 * wait for memory together, not one after the other. */
static int line(Tokenizer *self, const uint8_t *p, const uint8_t *end, Py_ssize_t *bad)
{
    if (grow((void **)&self->wend, &self->wend_cap, WORD_BATCH, sizeof(size_t)) < 0
        || grow((void **)&self->wkey, &self->wkey_cap, WORD_BATCH, sizeof(Key)) < 0)
        return -1;
    size_t nb = 0, start = 0, nw = 0, before = self->n_tokens;
    int empty = 1;
    for (const uint8_t *q = p; q <= end;) {
        uint32_t cp = 0;
        int len = 0, c = K_SEP;  /* the line's end ends a word */
        if (q < end) {
            if (!(len = utf8_next(q, end, &cp))) {
                *bad = 1;
                return -1;
            }
            if (!(c = self->cls[cp]) && (c = class_of(self, cp)) < 0)
                return -1;
            empty &= (c & C_SPACE) != 0;
        }
        int kind = c & C_KIND;
        if (kind == K_WORD || kind == K_ALONE) {
            if (grow((void **)&self->word, &self->word_cap, nb + 4, 1) < 0)
                return -1;
        }
        if (kind == K_WORD) {
            memcpy(self->word + nb, q, len);
            nb += len;
        } else if (kind != K_DROP) {  /* SEP or ALONE: a word ends; ALONE is one more */
            for (int alone = 0; alone < 2; alone++) {
                if (nb > start) {
                    Key k = hash_key(self->word + start, nb - start);
                    __builtin_prefetch(&self->memo.slots[k.h & (self->memo.cap - 1)]);
                    self->wkey[nw] = k;
                    self->wend[nw++] = start = nb;
                    if (nw == WORD_BATCH) {  /* a word: the line is not empty */
                        if (flush_words(self, nw) < 0)
                            return -1;
                        nw = nb = start = 0;
                    }
                }
                if (kind != K_ALONE || alone)
                    break;
                memcpy(self->word + nb, q, len);
                nb += len;
            }
        }
        if (q == end)
            break;
        q += len;
    }
    if (empty) {  /* closes a non-empty document */
        if (self->doc_seg[self->n_doc - 1] != (int64_t)self->n_seg - 1)
            return push_doc(self, (int64_t)self->n_seg - 1);
        return 0;
    }
    if (flush_words(self, nw) < 0)
        return -1;
    if (self->n_tokens != before)
        return push_seg(self, (int64_t)self->n_tokens);
    return 0;
}

/* feed(data): the lines of data, one text file or a piece of one ending with "\n" (a
 * final "\n" makes no empty line).  Invalid UTF-8: ValueError("invalid UTF-8"). */
static PyObject *Tokenizer_feed(Tokenizer *self, PyObject *arg)
{
    Py_buffer view;
    if (!self->cls) {
        PyErr_SetString(PyExc_RuntimeError, "Tokenizer not initialised");
        return NULL;
    }
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *p = view.buf, *end = p + view.len;
    Py_ssize_t bad = 0;
    while (p < end) {
        const uint8_t *nl = memchr(p, '\n', end - p);
        const uint8_t *stop = nl ? nl : end;
        if (line(self, p, stop, &bad) < 0) {
            PyBuffer_Release(&view);
            if (bad)
                PyErr_SetString(PyExc_ValueError, "invalid UTF-8");
            return NULL;
        }
        p = nl ? nl + 1 : end;
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* finish() -> (tokens int32 bytes, seg_off int64 bytes, doc_seg int64 bytes); the last
 * document closed. */
static PyObject *Tokenizer_finish(Tokenizer *self, PyObject *unused)
{
    if (!self->cls) {
        PyErr_SetString(PyExc_RuntimeError, "Tokenizer not initialised");
        return NULL;
    }
    if (self->doc_seg[self->n_doc - 1] != (int64_t)self->n_seg - 1
        && push_doc(self, (int64_t)self->n_seg - 1) < 0)
        return NULL;
    /* no tokens: tokens is NULL, which "y#" would give as None */
    return Py_BuildValue("y#y#y#", self->tokens ? (const char *)self->tokens : "",
                         (Py_ssize_t)(self->n_tokens * 4), (const char *)self->seg_off,
                         (Py_ssize_t)(self->n_seg * 8), (const char *)self->doc_seg,
                         (Py_ssize_t)(self->n_doc * 8));
}

static PyObject *Tokenizer_get_words(Tokenizer *self, void *c)
{
    return PyLong_FromSize_t(self->memo.used);
}

static PyMethodDef Tokenizer_methods[] = {
    {"feed", (PyCFunction)Tokenizer_feed, METH_O, "feed(data): tokenize the lines of UTF-8 bytes"},
    {"finish", (PyCFunction)Tokenizer_finish, METH_NOARGS,
     "finish() -> (tokens int32, seg_off int64, doc_seg int64) as bytes"},
    {NULL}
};

static PyGetSetDef Tokenizer_getset[] = {
    {"words", (getter)Tokenizer_get_words, NULL, "distinct whitespace tokens seen", NULL},
    {NULL}
};

static PyTypeObject TokenizerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mlperf_bert._fasttok.Tokenizer",
    .tp_basicsize = sizeof(Tokenizer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Tokenizer(vocab, unk_id, do_lower_case, classify, word_ids)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Tokenizer_init,
    .tp_dealloc = (destructor)Tokenizer_dealloc,
    .tp_methods = Tokenizer_methods,
    .tp_getset = Tokenizer_getset,
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_fasttok", "C tokenizer of the pre-training data generator.", -1, NULL
};

PyMODINIT_FUNC PyInit__fasttok(void)
{
    if (PyType_Ready(&TokenizerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&TokenizerType);
    if (PyModule_AddObject(m, "Tokenizer", (PyObject *)&TokenizerType) < 0) {
        Py_DECREF(&TokenizerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
