/* The gateway's hot loops over serialized OTLP profiles (profiles.proto v1.10), in C.
 *
 * A gateway receives profiles, batches them and sends them on. In Python, re-indexing a batch's
 * dictionary costs several times what decoding and encoding the same bytes does, because every
 * index field is a round trip into protobuf's runtime. Here the bytes are walked once and written
 * once: no message object is built. Two entry points, each with a pure-Python twin that the tests
 * run as well (pycollector/pdata/serialized/python.py, pycollector/otlp/profiles_wire/recognize.py):
 *
 *   append(source, sizes, zeros) -> (top, entries, sizes, zeros, samples)
 *       A message appended to a batch that holds `sizes` entries per dictionary table (and, per
 *       table, whether its entry 0 is the zero value): every index the source holds moves by its
 *       table's offset, the source's zero entries are left out where the batch's stand for them.
 *       `top` is the source's top-level fields but its dictionary, rewritten; `entries` its
 *       dictionary entries, rewritten, as fields of a ProfilesDictionary. Nothing is kept between
 *       calls: the batch is the caller's. ValueError "outside" when an index is outside its own
 *       table, "malformed" when the bytes are not a message of that shape.
 *
 *   validate(source, schema, counted) -> items, or None
 *       Whether protobuf's parser (upb) reads `source` as the message `schema` describes (a
 *       capsule from compile_schema, made of the message's descriptors in schema.py), and how many
 *       messages of type `counted` it holds (a profiles request's samples). None when it is not
 *       sure: malformed bytes, bad UTF-8 in a string, groups, nesting past 64; the caller then
 *       parses with protobuf, which says why or reads it after all.
 *
 *   recognize(source) -> (sample_evidence, profile_evidence, samples_looked_at)
 *       The evidence `recognize.py` gathers to tell the profiles.proto layout a sender wrote, from
 *       the same fields in the same order. None when the bytes are malformed or in a layout older
 *       than v1.8: the Python reader then says why in its own words.
 *
 * Everything here reads bytes a peer sent: every read is bounded by the end of its message, and a
 * varint stops after 10 bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { VARINT = 0, I64 = 1, LEN = 2, I32 = 5 };

/* -- reading ---------------------------------------------------------------------------------- */

typedef struct {
    uint32_t number;
    int wire;
    const uint8_t *key; /* where the field's key starts */
    const uint8_t *value; /* a LEN field's content, or the varint / fixed bytes */
    const uint8_t *end;
    uint64_t varint; /* a VARINT field's value */
} Field;

static inline __attribute__((always_inline)) int read_varint(const uint8_t **position, const uint8_t *end, uint64_t *value) {
    const uint8_t *p = *position;
    if (p < end && *p < 0x80) { /* most indices and lengths: one byte */
        *value = *p;
        *position = p + 1;
        return 0;
    }
    const uint8_t *stop = end - p > 10 ? p + 10 : end;
    uint64_t result = 0;
    int shift = 0;
    while (p < stop) {
        uint8_t byte = *p++;
        if (shift < 64)
            result |= (uint64_t)(byte & 0x7F) << shift;
        if (byte < 0x80) {
            *position = p;
            *value = result;
            return 0;
        }
        shift += 7;
    }
    return -1;
}

/* 1: a field was read into `field`; 0: the message ended; -1: malformed. */
static inline __attribute__((always_inline)) int next_field(const uint8_t **position, const uint8_t *end, Field *field) {
    const uint8_t *p = *position;
    uint64_t key, length;
    if (p >= end)
        return 0;
    field->key = p;
    if (read_varint(&p, end, &key) < 0)
        return -1;
    field->number = (uint32_t)(key >> 3);
    field->wire = (int)(key & 7);
    if (field->number == 0 || key >> 32)
        return -1;
    field->value = p;
    switch (field->wire) {
    case VARINT:
        if (read_varint(&p, end, &field->varint) < 0)
            return -1;
        break;
    case LEN:
        if (read_varint(&p, end, &length) < 0 || length > (uint64_t)(end - p))
            return -1;
        field->value = p;
        p += length;
        break;
    case I64:
        if (end - p < 8)
            return -1;
        p += 8;
        break;
    case I32:
        if (end - p < 4)
            return -1;
        p += 4;
        break;
    default: /* groups are proto2 only; 6 and 7 do not exist */
        return -1;
    }
    field->end = p;
    *position = p;
    return 1;
}

/* -- writing ---------------------------------------------------------------------------------- */

typedef struct {
    uint8_t *data;
    size_t length, capacity;
} Out;

static int grow(Out *out, size_t more);

static inline int out_reserve(Out *out, size_t more) {
    return out->length + more <= out->capacity ? 0 : grow(out, more);
}

static int grow(Out *out, size_t more) {
    size_t capacity = out->capacity ? out->capacity : 4096;
    while (capacity < out->length + more)
        capacity *= 2;
    uint8_t *data = PyMem_RawRealloc(out->data, capacity);
    if (data == NULL)
        return -1;
    out->data = data;
    out->capacity = capacity;
    return 0;
}

static inline int out_bytes(Out *out, const uint8_t *bytes, size_t size) {
    if (out_reserve(out, size) < 0)
        return -1;
    memcpy(out->data + out->length, bytes, size);
    out->length += size;
    return 0;
}

static inline size_t varint_size(uint64_t value) {
    size_t size = 1;
    while (value > 0x7F) {
        value >>= 7;
        size++;
    }
    return size;
}

/* Writes `value` at `at`; returns how many bytes it took. */
static inline size_t put_varint(uint8_t *at, uint64_t value) {
    uint8_t *start = at;
    while (value > 0x7F) {
        *at++ = (uint8_t)(value | 0x80);
        value >>= 7;
    }
    *at++ = (uint8_t)value;
    return at - start;
}

static inline int out_varint(Out *out, uint64_t value) {
    if (out_reserve(out, 10) < 0)
        return -1;
    out->length += put_varint(out->data + out->length, value);
    return 0;
}

/* A length-delimited field whose content is written after it: its key, then room for its length
 * as long as the source's was (`source_length`), which moved indices seldom outgrow; `close_len`
 * writes the length it then knows, moving the content only when its varint is of another size. */
typedef struct {
    size_t content; /* where the content starts */
    size_t room; /* bytes left for the length */
} Opened;

static int open_len(Out *out, uint32_t number, uint64_t source_length, Opened *opened) {
    opened->room = varint_size(source_length);
    if (out_varint(out, ((uint64_t)number << 3) | LEN) < 0 || out_reserve(out, opened->room) < 0)
        return -1;
    out->length += opened->room;
    opened->content = out->length;
    return 0;
}

static int close_len(Out *out, const Opened *opened) {
    size_t length = out->length - opened->content;
    size_t size = varint_size(length);
    if (size != opened->room) {
        if (size > opened->room && out_reserve(out, size - opened->room) < 0)
            return -1;
        memmove(out->data + opened->content - opened->room + size, out->data + opened->content, length);
        out->length = out->length - opened->room + size;
    }
    put_varint(out->data + opened->content - opened->room, length);
    return 0;
}

/* -- what moves ------------------------------------------------------------------------------- */

/* Dictionary tables, by their field number in ProfilesDictionary. */
enum { MAPPINGS = 1, LOCATIONS = 2, FUNCTIONS = 3, LINKS = 4, STRINGS = 5, ATTRIBUTES = 6, STACKS = 7, TABLES = 8 };

typedef struct {
    uint64_t size[TABLES]; /* the source's entries (1 for a table it leaves out) */
    uint64_t by[TABLES];
    int drop_zero[TABLES];
} Moves;

/* The source's index -> the batch's; -1 when outside the source's table. */
static inline int move(const Moves *moves, int table, uint64_t index, uint64_t *moved) {
    if (index >= moves->size[table])
        return -1;
    *moved = index == 0 && moves->drop_zero[table] ? 0 : index + moves->by[table];
    return 0;
}

enum { COPY, INDEX, INDICES, MESSAGE };

typedef struct Rule {
    uint32_t number;
    int kind;
    int table; /* INDEX, INDICES: the table the index points into */
    const struct Rule *message; /* MESSAGE: the rules of the field's message */
    int singular; /* MESSAGE: not repeated, so that a message left out reads as an empty one */
} Rule;

/* The index fields of each message of profiles.proto v1.10 (python.py checks these numbers
 * against the installed classes); fields not named are copied as they are. */
static const Rule LINE[] = {{1, INDEX, FUNCTIONS, NULL}, {0}};
static const Rule LOCATION[] = {{1, INDEX, MAPPINGS, NULL}, {3, MESSAGE, 0, LINE}, {4, INDICES, ATTRIBUTES, NULL}, {0}};
static const Rule MAPPING[] = {{4, INDEX, STRINGS, NULL}, {5, INDICES, ATTRIBUTES, NULL}, {0}};
static const Rule FUNCTION[] = {{1, INDEX, STRINGS, NULL}, {2, INDEX, STRINGS, NULL}, {3, INDEX, STRINGS, NULL}, {0}};
static const Rule ATTRIBUTE[] = {{1, INDEX, STRINGS, NULL}, {3, INDEX, STRINGS, NULL}, {0}};
static const Rule STACK[] = {{1, INDICES, LOCATIONS, NULL}, {0}};
static const Rule SAMPLE[] = {{1, INDEX, STACKS, NULL}, {2, INDICES, ATTRIBUTES, NULL}, {3, INDEX, LINKS, NULL}, {0}};
static const Rule VALUE_TYPE[] = {{1, INDEX, STRINGS, NULL}, {2, INDEX, STRINGS, NULL}, {0}};
static const Rule PROFILE[] = {{1, MESSAGE, 0, VALUE_TYPE, 1}, {2, MESSAGE, 0, SAMPLE}, {5, MESSAGE, 0, VALUE_TYPE, 1}, {11, INDICES, ATTRIBUTES, NULL}, {0}};
static const Rule SCOPE[] = {{2, MESSAGE, 0, PROFILE}, {0}};
static const Rule RESOURCE[] = {{2, MESSAGE, 0, SCOPE}, {0}};

/* NULL: entries copied as they are (strings; links, which hold no index). */
static const Rule *const ENTRY_RULES[TABLES] = {
    [MAPPINGS] = MAPPING, [LOCATIONS] = LOCATION, [FUNCTIONS] = FUNCTION, [ATTRIBUTES] = ATTRIBUTE, [STACKS] = STACK,
};

typedef struct {
    const Moves *moves;
    Py_ssize_t samples;
    const char *error; /* "outside" or "malformed" */
} Rewrite;

static inline const Rule *rule_for(const Rule *rules, uint32_t number) {
    for (; rules->number; rules++)
        if (rules->number == number)
            return rules;
    return NULL;
}

static int fail(Rewrite *rewrite, const char *error) {
    if (rewrite->error == NULL)
        rewrite->error = error;
    return -1;
}

/* Repeated indices, packed or one by one: written packed, as protobuf writes them. The hot loop of
 * a batch (a stack's locations, half of all indices), so written without a check per index: a
 * moved index is below 2^35 (an index of a message's table plus the entries before it), so 5
 * bytes per source byte is room enough. */
#define MOVED_INDEX_ROOM 5

static int rewrite_indices(Rewrite *rewrite, Out *out, const Field *field, int table) {
    const Moves *moves = rewrite->moves;
    uint64_t index, moved, size = moves->size[table], by = moves->by[table];
    int drop_zero = moves->drop_zero[table];
    if (field->wire == VARINT) {
        if (move(moves, table, field->varint, &moved) < 0)
            return fail(rewrite, "outside");
        return out_varint(out, ((uint64_t)field->number << 3) | VARINT) < 0 || out_varint(out, moved) < 0 ? -1 : 0;
    }
    Opened opened;
    size_t most = (size_t)(field->end - field->value) * MOVED_INDEX_ROOM;
    if (open_len(out, field->number, field->end - field->value, &opened) < 0 || out_reserve(out, most) < 0)
        return -1;
    uint8_t *write = out->data + out->length;
    const uint8_t *p = field->value;
    while (p < field->end) {
        if (read_varint(&p, field->end, &index) < 0)
            return fail(rewrite, "malformed");
        if (index >= size)
            return fail(rewrite, "outside");
        moved = index == 0 && drop_zero ? 0 : index + by;
        write += put_varint(write, moved);
    }
    out->length = write - out->data;
    return close_len(out, &opened);
}

static int rewrite_message(Rewrite *rewrite, Out *out, const uint8_t *p, const uint8_t *end, const Rule *rules);

/* Whether a message of `rules` left out must be written: an index it holds, 0 as it is left
 * out, moves elsewhere. */
static int moves_zero(const Moves *moves, const Rule *rules) {
    for (; rules->number; rules++)
        if (rules->kind == INDEX && !moves->drop_zero[rules->table])
            return 1;
    return 0;
}

/* An index field left out is 0 to protobuf. Where index 0 moves (the source's zero entry is
 * kept), 0 is written as the index it moved to, and a singular message left out is written
 * with its moved zeros. */
static int write_moved_zeros(Rewrite *rewrite, Out *out, const Rule *rules, unsigned seen) {
    const Moves *moves = rewrite->moves;
    for (const Rule *rule = rules; rule->number; rule++) {
        if (seen & (1u << (rule - rules)))
            continue;
        if (rule->kind == INDEX && !moves->drop_zero[rule->table]) {
            if (out_varint(out, ((uint64_t)rule->number << 3) | VARINT) < 0 || out_varint(out, moves->by[rule->table]) < 0)
                return -1;
        } else if (rule->kind == MESSAGE && rule->singular && moves_zero(moves, rule->message)) {
            Opened opened;
            if (open_len(out, rule->number, 0, &opened) < 0 || rewrite_message(rewrite, out, NULL, NULL, rule->message) < 0
                || close_len(out, &opened) < 0)
                return -1;
        }
    }
    return 0;
}

/* The content of one message, its index fields moved. */
static int rewrite_message(Rewrite *rewrite, Out *out, const uint8_t *p, const uint8_t *end, const Rule *rules) {
    Field field;
    int status;
    uint64_t moved;
    unsigned seen = 0; /* the rules whose field the message holds */
    if (rules == SAMPLE)
        rewrite->samples++;
    while ((status = next_field(&p, end, &field)) > 0) {
        const Rule *rule = rule_for(rules, field.number);
        int kind = rule == NULL ? COPY : rule->kind;
        /* A field of another wire type than its type's is an unknown field to protobuf: copied. */
        if (kind == INDEX && field.wire == VARINT) {
            if (move(rewrite->moves, rule->table, field.varint, &moved) < 0)
                return fail(rewrite, "outside");
            if (out_bytes(out, field.key, field.value - field.key) < 0 || out_varint(out, moved) < 0)
                return -1;
        } else if (kind == INDICES && (field.wire == VARINT || field.wire == LEN)) {
            if (rewrite_indices(rewrite, out, &field, rule->table) < 0)
                return -1;
        } else if (kind == MESSAGE && field.wire == LEN) {
            Opened opened;
            if (open_len(out, field.number, field.end - field.value, &opened) < 0
                || rewrite_message(rewrite, out, field.value, field.end, rule->message) < 0 || close_len(out, &opened) < 0)
                return -1;
        } else {
            if (out_bytes(out, field.key, field.end - field.key) < 0)
                return -1;
            continue;
        }
        seen |= 1u << (rule - rules);
    }
    if (status < 0)
        return fail(rewrite, "malformed");
    return write_moved_zeros(rewrite, out, rules, seen);
}

/* -- append ----------------------------------------------------------------------------------- */

/* Every dictionary of the source (a singular message field may occur more than once: protobuf
 * merges the occurrences), and per table its entries and whether the first is empty. */
#define MAX_DICTIONARIES 64

typedef struct {
    const uint8_t *start[MAX_DICTIONARIES], *end[MAX_DICTIONARIES];
    int count;
    uint64_t entries[TABLES];
    int first_empty[TABLES];
} Dictionaries;

static int find_dictionaries(const uint8_t *p, const uint8_t *end, Dictionaries *found) {
    Field field, entry;
    int status;
    memset(found, 0, sizeof *found);
    while ((status = next_field(&p, end, &field)) > 0) {
        if (field.number != 2 || field.wire != LEN)
            continue;
        if (found->count == MAX_DICTIONARIES)
            return -1;
        found->start[found->count] = field.value;
        found->end[found->count++] = field.end;
        const uint8_t *q = field.value;
        while ((status = next_field(&q, field.end, &entry)) > 0) {
            if (entry.number < TABLES && entry.wire == LEN) {
                if (found->entries[entry.number]++ == 0)
                    found->first_empty[entry.number] = entry.end == entry.value;
            }
        }
        if (status < 0)
            return -1;
    }
    return status;
}

/* The order in which zero entries are decided: the tables a zero entry refers to come first. */
static const int DECISION_ORDER[] = {STRINGS, ATTRIBUTES, MAPPINGS, FUNCTIONS, LOCATIONS, STACKS, LINKS};

static int referred_zeros_dropped(int table, const int *drop_zero) {
    switch (table) {
    case ATTRIBUTES: case MAPPINGS: case FUNCTIONS:
        return drop_zero[STRINGS];
    case LOCATIONS:
        return drop_zero[MAPPINGS];
    default:
        return 1;
    }
}

static int read_table_state(PyObject *sequence, const char *what, uint64_t *values) {
    PyObject *items = PySequence_Fast(sequence, what);
    if (items == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(items) != TABLES - 1) {
        Py_DECREF(items);
        PyErr_Format(PyExc_ValueError, "%s: one value per table (7)", what);
        return -1;
    }
    for (int table = 1; table < TABLES; table++) {
        values[table] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(items, table - 1));
        if (PyErr_Occurred()) {
            Py_DECREF(items);
            return -1;
        }
    }
    Py_DECREF(items);
    return 0;
}

static PyObject *table_tuple(const uint64_t *values) {
    PyObject *tuple = PyTuple_New(TABLES - 1);
    if (tuple == NULL)
        return NULL;
    for (int table = 1; table < TABLES; table++) {
        PyObject *value = PyLong_FromUnsignedLongLong(values[table]);
        if (value == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, table - 1, value);
    }
    return tuple;
}

static PyObject *append(PyObject *self, PyObject *args) {
    Py_buffer source;
    PyObject *sizes_arg, *zeros_arg, *result = NULL;
    uint64_t sizes[TABLES], zeros[TABLES];
    Dictionaries dictionaries;
    Moves moves;
    Out top = {0}, entries = {0};
    Rewrite rewrite = {&moves, 0, NULL};
    if (!PyArg_ParseTuple(args, "y*OO:append", &source, &sizes_arg, &zeros_arg))
        return NULL;
    const uint8_t *start = source.buf, *end = start + source.len;
    if (read_table_state(sizes_arg, "sizes", sizes) < 0 || read_table_state(zeros_arg, "zeros", zeros) < 0)
        goto done;

    Py_BEGIN_ALLOW_THREADS
    if (find_dictionaries(start, end, &dictionaries) < 0) {
        rewrite.error = "malformed";
    } else {
        /* Per table: where the source's indices go (see appending.Move), and the batch's missing
         * zero entry. A table the source leaves out holds its zero entry, which is appended when
         * the batch's does not stand for it. */
        for (size_t i = 0; i < sizeof DECISION_ORDER / sizeof *DECISION_ORDER; i++) {
            int table = DECISION_ORDER[i];
            uint64_t size = sizes[table];
            if (size == 0) {
                if (out_varint(&entries, ((uint64_t)table << 3) | LEN) < 0 || out_varint(&entries, 0) < 0) {
                    fail(&rewrite, "memory");
                    break;
                }
                size = 1;
                zeros[table] = 1;
            }
            int theirs_empty = dictionaries.entries[table] == 0 || dictionaries.first_empty[table];
            int drop = zeros[table] && theirs_empty && referred_zeros_dropped(table, moves.drop_zero);
            uint64_t theirs = dictionaries.entries[table] ? dictionaries.entries[table] : 1;
            moves.size[table] = theirs;
            moves.by[table] = drop ? size - 1 : size;
            moves.drop_zero[table] = drop;
            sizes[table] = size + theirs - (drop ? 1 : 0);
            if (!drop && dictionaries.entries[table] == 0) { /* the source's implied zero entry */
                if (out_varint(&entries, ((uint64_t)table << 3) | LEN) < 0 || out_varint(&entries, 0) < 0) {
                    fail(&rewrite, "memory");
                    break;
                }
            }
        }
        /* The entries, in the source's order, its first of each table left out when dropped. */
        uint64_t seen[TABLES] = {0};
        for (int d = 0; d < dictionaries.count && rewrite.error == NULL; d++) {
            const uint8_t *p = dictionaries.start[d];
            Field entry;
            while (rewrite.error == NULL && next_field(&p, dictionaries.end[d], &entry) > 0) {
                if (entry.number >= TABLES || entry.wire != LEN)
                    continue; /* not a table: protobuf keeps it as an unknown field of the dictionary */
                if (seen[entry.number]++ == 0 && moves.drop_zero[entry.number])
                    continue;
                Opened opened;
                const Rule *rules = ENTRY_RULES[entry.number];
                if (rules == NULL) {
                    if (out_bytes(&entries, entry.key, entry.end - entry.key) < 0)
                        fail(&rewrite, "memory");
                } else if (open_len(&entries, entry.number, entry.end - entry.value, &opened) < 0
                           || rewrite_message(&rewrite, &entries, entry.value, entry.end, rules) < 0
                           || close_len(&entries, &opened) < 0) {
                    fail(&rewrite, "memory"); /* keeps the reason rewrite_message gave, if it gave one */
                }
            }
        }
        /* The top-level fields: resource profiles rewritten, the dictionary left out, the rest
         * as it is. */
        const uint8_t *p = start;
        Field field;
        while (rewrite.error == NULL && next_field(&p, end, &field) > 0) {
            if (field.number == 2 && field.wire == LEN)
                continue;
            if (field.number == 1 && field.wire == LEN) {
                Opened opened;
                if (open_len(&top, 1, field.end - field.value, &opened) < 0
                    || rewrite_message(&rewrite, &top, field.value, field.end, RESOURCE) < 0 || close_len(&top, &opened) < 0)
                    fail(&rewrite, "memory");
            } else if (out_bytes(&top, field.key, field.end - field.key) < 0) {
                fail(&rewrite, "memory");
            }
        }
    }
    Py_END_ALLOW_THREADS

    if (rewrite.error != NULL) {
        if (strcmp(rewrite.error, "memory") == 0)
            PyErr_NoMemory();
        else
            PyErr_SetString(PyExc_ValueError, rewrite.error);
        goto done;
    }
    PyObject *sizes_out = table_tuple(sizes), *zeros_out = table_tuple(zeros);
    if (sizes_out != NULL && zeros_out != NULL)
        result = Py_BuildValue("y#y#NNn", top.data ? (const char *)top.data : "", (Py_ssize_t)top.length,
                               entries.data ? (const char *)entries.data : "", (Py_ssize_t)entries.length,
                               sizes_out, zeros_out, rewrite.samples);
    else {
        Py_XDECREF(sizes_out);
        Py_XDECREF(zeros_out);
    }
done:
    PyMem_RawFree(top.data);
    PyMem_RawFree(entries.data);
    PyBuffer_Release(&source);
    return result;
}

/* -- validate ------------------------------------------------------------------------------- */

enum { S_VARINT = 0, S_FIXED64 = 1, S_FIXED32 = 2, S_STRING = 3, S_BYTES = 4, S_MESSAGE = 5 };

typedef struct {
    uint32_t number;
    int kind;
    int repeated;
    int message; /* S_MESSAGE: the index of its type in the schema */
} SchemaField;

typedef struct {
    SchemaField *fields;
    Py_ssize_t count;
} SchemaMessage;

typedef struct {
    SchemaMessage *messages;
    Py_ssize_t count;
} Schema;

#define SCHEMA_CAPSULE "pycollector.pdata.serialized.Schema"
#define MAX_DEPTH 64

static void free_schema(PyObject *capsule) {
    Schema *schema = PyCapsule_GetPointer(capsule, SCHEMA_CAPSULE);
    if (schema == NULL)
        return;
    for (Py_ssize_t i = 0; i < schema->count; i++)
        PyMem_Free(schema->messages[i].fields);
    PyMem_Free(schema->messages);
    PyMem_Free(schema);
}

/* compile_schema([[(number, kind, repeated, message index), ...] per message type]) -> capsule */
static PyObject *compile_schema(PyObject *self, PyObject *args) {
    PyObject *messages;
    if (!PyArg_ParseTuple(args, "O!:compile_schema", &PyList_Type, &messages))
        return NULL;
    Schema *schema = PyMem_Calloc(1, sizeof *schema);
    if (schema == NULL)
        return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(schema, SCHEMA_CAPSULE, free_schema);
    if (capsule == NULL) {
        PyMem_Free(schema);
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(messages);
    schema->messages = PyMem_Calloc(count ? count : 1, sizeof *schema->messages);
    if (schema->messages == NULL) {
        Py_DECREF(capsule);
        return PyErr_NoMemory();
    }
    schema->count = count;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *fields = PyList_GET_ITEM(messages, i);
        if (!PyList_Check(fields)) {
            Py_DECREF(capsule);
            PyErr_SetString(PyExc_TypeError, "compile_schema: a list of fields per message");
            return NULL;
        }
        Py_ssize_t n = PyList_GET_SIZE(fields);
        schema->messages[i].fields = PyMem_Calloc(n ? n : 1, sizeof(SchemaField));
        if (schema->messages[i].fields == NULL) {
            Py_DECREF(capsule);
            return PyErr_NoMemory();
        }
        schema->messages[i].count = n;
        for (Py_ssize_t j = 0; j < n; j++) {
            SchemaField *field = &schema->messages[i].fields[j];
            unsigned int number;
            if (!PyArg_ParseTuple(PyList_GET_ITEM(fields, j), "Iiii", &number, &field->kind, &field->repeated, &field->message)) {
                Py_DECREF(capsule);
                return NULL;
            }
            field->number = number;
            if (field->kind == S_MESSAGE && (field->message < 0 || field->message >= count)) {
                Py_DECREF(capsule);
                PyErr_SetString(PyExc_ValueError, "compile_schema: a message field's type is not in the schema");
                return NULL;
            }
        }
    }
    return capsule;
}

/* UTF-8 as protobuf checks it in a string field: no overlong forms, surrogates or code points
 * past U+10FFFF. */
static int valid_utf8(const uint8_t *s, const uint8_t *end) {
    while (s < end) {
        if (end - s >= 8) {
            uint64_t word;
            memcpy(&word, s, 8);
            if ((word & 0x8080808080808080ULL) == 0) {
                s += 8;
                continue;
            }
        }
        uint8_t c = *s;
        if (c < 0x80) {
            s++;
            continue;
        }
        int more;
        uint8_t low = 0x80, high = 0xBF; /* the second byte's range */
        if (c >= 0xC2 && c <= 0xDF)
            more = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0)
                low = 0xA0;
            else if (c == 0xED)
                high = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0)
                low = 0x90;
            else if (c == 0xF4)
                high = 0x8F;
        } else
            return 0;
        if (end - s <= more || s[1] < low || s[1] > high)
            return 0;
        for (int k = 2; k <= more; k++)
            if ((s[k] & 0xC0) != 0x80)
                return 0;
        s += more + 1;
    }
    return 1;
}

typedef struct {
    const Schema *schema;
    int counted;
    Py_ssize_t items;
} Validation;

static const SchemaField *schema_field(const SchemaMessage *message, uint32_t number) {
    for (Py_ssize_t i = 0; i < message->count; i++)
        if (message->fields[i].number == number)
            return &message->fields[i];
    return NULL;
}

/* 0 when protobuf reads it; -1 when not sure. A field of another wire type than its type's is an
 * unknown field to protobuf, which it keeps without reading. */
static int validate_message(Validation *validation, int type, const uint8_t *p, const uint8_t *end, int depth) {
    const SchemaMessage *message = &validation->schema->messages[type];
    Field field;
    int status;
    if (depth > MAX_DEPTH)
        return -1;
    if (type == validation->counted)
        validation->items++;
    while ((status = next_field(&p, end, &field)) > 0) {
        if (field.number >= (1u << 29))
            return -1;
        const SchemaField *known = schema_field(message, field.number);
        if (known == NULL || field.wire != LEN)
            continue; /* fixed and varint fields: next_field read them whole */
        switch (known->kind) {
        case S_VARINT:
            if (known->repeated) {
                const uint8_t *q = field.value;
                uint64_t ignored;
                while (q < field.end)
                    if (read_varint(&q, field.end, &ignored) < 0)
                        return -1;
            }
            break;
        case S_FIXED64:
        case S_FIXED32:
            if (known->repeated && (field.end - field.value) % (known->kind == S_FIXED64 ? 8 : 4))
                return -1;
            break;
        case S_STRING:
            if (!valid_utf8(field.value, field.end))
                return -1;
            break;
        case S_MESSAGE:
            if (validate_message(validation, known->message, field.value, field.end, depth + 1) < 0)
                return -1;
            break;
        default:
            break;
        }
    }
    return status < 0 ? -1 : 0;
}

static PyObject *validate(PyObject *self, PyObject *args) {
    Py_buffer source;
    PyObject *capsule;
    int counted, status;
    if (!PyArg_ParseTuple(args, "y*Oi:validate", &source, &capsule, &counted))
        return NULL;
    Schema *schema = PyCapsule_GetPointer(capsule, SCHEMA_CAPSULE);
    if (schema == NULL || schema->count == 0) {
        PyBuffer_Release(&source);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "validate: an empty schema");
        return NULL;
    }
    Validation validation = {schema, counted, 0};
    Py_BEGIN_ALLOW_THREADS
    status = validate_message(&validation, 0, source.buf, (const uint8_t *)source.buf + source.len, 0);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&source);
    if (status < 0)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(validation.items);
}

/* -- recognize -------------------------------------------------------------------------------- */

enum { SAMPLE_V1_9 = 1, SAMPLE_V1_10 = 2 };
enum { PROFILE_V1_8 = 1, PROFILE_V1_9_ON = 2 };
#define PROFILE_ID_SIZE 16
#define SAMPLES_LOOKED_AT 256

typedef struct {
    int sample, profile; /* bit sets of the layouts told */
    int samples_seen;
    uint64_t attributes;
} Evidence;

/* recognize.py's _dictionary: the attribute table's entries; -1 when malformed or v1.7. */
static int64_t attribute_entries(const uint8_t *p, const uint8_t *end) {
    Field entry, field;
    int status;
    int64_t attributes = 0;
    while ((status = next_field(&p, end, &entry)) > 0) {
        if (entry.number != 6 || entry.wire != LEN)
            continue;
        if (!attributes) {
            const uint8_t *q = entry.value;
            int inner;
            while ((inner = next_field(&q, entry.end, &field)) > 0)
                if (field.number == 1 && field.wire == LEN)
                    return -1; /* a KeyValue: v1.7 */
            if (inner < 0)
                return -1;
        }
        attributes++;
    }
    if (status < 0)
        return -1;
    return attributes > 1 ? attributes : 1;
}

static int count_varints(const uint8_t *p, const uint8_t *end) {
    int count = 0;
    for (; p < end; p++)
        count += *p < 0x80;
    return count;
}

/* recognize.py's _sample: SAMPLE_V1_9, SAMPLE_V1_10, 0 when it cannot tell, -1 when malformed. */
static int sample_evidence(const uint8_t *p, const uint8_t *end, uint64_t attributes) {
    Field field, field_2;
    int status, has_field_2 = 0, has_timestamps = 0;
    while ((status = next_field(&p, end, &field)) > 0) {
        if (field.number == 3)
            return field.wire == LEN ? SAMPLE_V1_9 : SAMPLE_V1_10;
        if (field.number == 4)
            return field.wire == LEN ? SAMPLE_V1_10 : SAMPLE_V1_9;
        if (field.number == 2) {
            field_2 = field;
            has_field_2 = 1;
        } else if (field.number == 5) {
            has_timestamps = 1;
        }
    }
    if (status < 0)
        return -1;
    if (!has_field_2)
        return 0;
    if (!has_timestamps)
        return SAMPLE_V1_9;
    if (field_2.wire == LEN && count_varints(field_2.value, field_2.end) != 1)
        return SAMPLE_V1_10;
    const uint8_t *q = field_2.value;
    uint64_t number;
    if (read_varint(&q, field_2.end, &number) < 0)
        return -1;
    return number >= attributes ? SAMPLE_V1_9 : 0;
}

/* recognize.py's _profile; -1 when malformed or v1.7. */
static int profile_evidence(const uint8_t *p, const uint8_t *end, Evidence *evidence) {
    Field field, inner;
    int status;
    while ((status = next_field(&p, end, &field)) > 0) {
        uint32_t number = field.number;
        int wire = field.wire;
        if (number == 2 && wire == LEN) {
            if (evidence->samples_seen < SAMPLES_LOOKED_AT && !evidence->sample) {
                evidence->samples_seen++;
                int told = sample_evidence(field.value, field.end, evidence->attributes);
                if (told < 0)
                    return -1;
                evidence->sample |= told;
            }
        } else if (number == 3 && wire != I64) {
            return -1; /* v1.7's location indices */
        } else if ((number == 1 || number == 5) && wire == LEN) {
            const uint8_t *q = field.value;
            int found;
            while ((found = next_field(&q, field.end, &inner)) > 0)
                if (inner.number == 3)
                    break;
            if (found < 0)
                return -1;
            if (found > 0)
                evidence->profile |= PROFILE_V1_8; /* ValueType.aggregation_temporality */
        } else if (number == 7 && wire == LEN) {
            if (field.end - field.value != 0 && field.end - field.value != PROFILE_ID_SIZE)
                evidence->profile |= PROFILE_V1_8;
        } else if (number == 12 || (number == 8 && wire == LEN) || (number == 9 && wire == VARINT)) {
            evidence->profile |= PROFILE_V1_8;
        } else if ((number == 8 && wire == VARINT) || (number == 9 && wire == LEN)) {
            evidence->profile |= PROFILE_V1_9_ON;
        }
    }
    return status < 0 ? -1 : 0;
}

/* The profiles of one ResourceProfiles, each walked; -1 when malformed or v1.7. */
static int resource_evidence(const uint8_t *p, const uint8_t *end, Evidence *evidence) {
    Field scope, profile;
    int status, inner;
    while ((status = next_field(&p, end, &scope)) > 0) {
        if (scope.number != 2 || scope.wire != LEN)
            continue;
        const uint8_t *q = scope.value;
        while ((inner = next_field(&q, scope.end, &profile)) > 0)
            if (profile.number == 2 && profile.wire == LEN && profile_evidence(profile.value, profile.end, evidence) < 0)
                return -1;
        if (inner < 0)
            return -1;
    }
    return status < 0 ? -1 : 0;
}

static PyObject *recognize(PyObject *self, PyObject *args) {
    Py_buffer source;
    Evidence evidence = {0, 0, 0, 1};
    int failed = 0, status;
    Field field;
    if (!PyArg_ParseTuple(args, "y*:recognize", &source))
        return NULL;
    const uint8_t *start = source.buf, *end = start + source.len, *p;
    Py_BEGIN_ALLOW_THREADS
    for (p = start; (status = next_field(&p, end, &field)) > 0;) {
        if (field.number == 2 && field.wire == LEN) {
            int64_t attributes = attribute_entries(field.value, field.end);
            if (attributes < 0) {
                failed = 1;
                break;
            }
            evidence.attributes = (uint64_t)attributes;
        }
    }
    failed |= status < 0;
    for (p = start; !failed && (status = next_field(&p, end, &field)) > 0;) {
        int decided = evidence.sample && evidence.profile;
        if (field.number == 1 && field.wire == LEN && !decided && resource_evidence(field.value, field.end, &evidence) < 0)
            failed = 1;
    }
    failed |= status < 0;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&source);
    if (failed)
        Py_RETURN_NONE;
    return Py_BuildValue("iii", evidence.sample, evidence.profile, evidence.samples_seen);
}

static PyMethodDef METHODS[] = {
    {"compile_schema", compile_schema, METH_VARARGS, "A message's descriptors, as validate reads them."},
    {"validate", validate, METH_VARARGS, "Whether protobuf reads the bytes as the schema's message, and its items."},
    {"append", append, METH_VARARGS, "A serialized ProfilesData's fields moved to follow a batch's tables."},
    {"recognize", recognize, METH_VARARGS, "What tells the profiles.proto layout of a serialized ProfilesData."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&MODULE); }
