/* The JSON walk shared by the native tabler (_scan.c) and the merged-trace rewriter
 * (_rewrite.c): a cursor over bytes, validated strings (escapes, control characters, UTF-8),
 * numbers and literals, the object/array walk, and exact number conversions. Every function
 * returns 0 on malformed input, leaving the cursor somewhere inside it. */
#ifndef HARNESS_JSON_H
#define HARNESS_JSON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 64
#define NUMBER_CHARS 64

typedef struct {
    const unsigned char *p, *end;
} Cur;

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static inline int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n) cap *= 2;
        char *d = PyMem_Realloc(b->data, cap);
        if (!d) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

static inline void ws(Cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

/* One UTF-8 sequence starting at c->p (a byte >= 0x80): advance past it, 0 if invalid. */
static inline int utf8_seq(Cur *c) {
    const unsigned char *p = c->p;
    unsigned char b = *p;
    int n;
    unsigned int lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) n = 1;
    else if (b == 0xE0) { n = 2; lo = 0xA0; }
    else if (b >= 0xE1 && b <= 0xEC) n = 2;
    else if (b == 0xED) { n = 2; hi = 0x9F; }
    else if (b >= 0xEE && b <= 0xEF) n = 2;
    else if (b == 0xF0) { n = 3; lo = 0x90; }
    else if (b >= 0xF1 && b <= 0xF3) n = 3;
    else if (b == 0xF4) { n = 3; hi = 0x8F; }
    else return 0;
    if (c->end - p <= n) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (int i = 2; i <= n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    c->p = p + n + 1;
    return 1;
}

static inline int is_hex(unsigned char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
#define HAS_ZERO(v) (((v) - ONES) & ~(v) & HIGHS)

/* Whether none of 8 bytes ends or complicates a string: no '"', '\\', control character or
 * non-ASCII byte (each test exact for whether such a byte exists, once no high bit is set). */
static inline int plain8(uint64_t x) {
    return !((x & HIGHS) | HAS_ZERO(x ^ (ONES * '"')) | HAS_ZERO(x ^ (ONES * '\\')) | ((x - ONES * 0x20) & ~x & HIGHS));
}

/* A string at c->p (which is '"'): its raw contents [*s, *s + *n) and whether they hold an
 * escape. Validates escapes, control characters and UTF-8. Plain ASCII runs go 8 bytes a step. */
static inline int string(Cur *c, const unsigned char **s, Py_ssize_t *n, int *escaped) {
    c->p++;
    *s = c->p;
    *escaped = 0;
    while (c->p < c->end) {
        while (c->end - c->p >= 8) {
            uint64_t x;
            memcpy(&x, c->p, 8);
            if (!plain8(x)) break;
            c->p += 8;
        }
        if (c->p >= c->end) break;
        unsigned char ch = *c->p;
        if (ch == '"') {
            *n = c->p - *s;
            c->p++;
            return 1;
        }
        if (ch < 0x20) return 0;
        if (ch == '\\') {
            *escaped = 1;
            if (c->end - c->p < 2) return 0;
            unsigned char e = c->p[1];
            if (e == 'u') {
                if (c->end - c->p < 6) return 0;
                for (int i = 2; i < 6; i++)
                    if (!is_hex(c->p[i])) return 0;
                c->p += 6;
            } else if (strchr("\"\\/bfnrt", e) && e) {
                c->p += 2;
            } else {
                return 0;
            }
        } else if (ch >= 0x80) {
            if (!utf8_seq(c)) return 0;
        } else {
            c->p++;
        }
    }
    return 0;
}

/* A JSON number at c->p: its text [*s, c->p) and whether it is an integer literal. */
static inline int number(Cur *c, const unsigned char **s, int *integer) {
    const unsigned char *p = c->p, *e = c->end;
    *s = p;
    *integer = 1;
    if (p < e && *p == '-') p++;
    if (p >= e) return 0;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (p < e && *p >= '0' && *p <= '9') p++;
    else return 0;
    if (p < e && *p == '.') {
        *integer = 0;
        p++;
        if (p >= e || *p < '0' || *p > '9') return 0;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        *integer = 0;
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') return 0;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    c->p = p;
    return 1;
}

static inline int literal(Cur *c, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n)) return 0;
    c->p += n;
    return 1;
}

/* The walk over an object's members or an array's items, shared by skip and the readers of events:
 *   more = open_container(c, '}');                      (c->p at '{' or '[')
 *   while (more > 0) { [member_key(...)]; value; more = next_item(c, '}'); }
 *   more < 0: malformed. */

/* Past the opening bracket: 0 when the container is empty (closed too), 1 when items follow. */
static inline int open_container(Cur *c, unsigned char close) {
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 0;
    }
    return 1;
}

/* `"key" :` and the whitespace around; the key's raw text and whether it holds an escape. */
static inline int member_key(Cur *c, const unsigned char **k, Py_ssize_t *kn, int *escaped) {
    if (c->p >= c->end || *c->p != '"' || !string(c, k, kn, escaped)) return 0;
    ws(c);
    if (c->p >= c->end || *c->p != ':') return 0;
    c->p++;
    ws(c);
    return c->p < c->end;
}

/* After an item: 1 past a comma (another item follows), 0 past the closing bracket, -1 else. */
static inline int next_item(Cur *c, unsigned char close) {
    ws(c);
    if (c->p >= c->end) return -1;
    if (*c->p == ',') {
        c->p++;
        ws(c);
        return 1;
    }
    if (*c->p != close) return -1;
    c->p++;
    return 0;
}

/* After an element of a block of comma-separated elements (no brackets): 1 past the comma
 * and the whitespace before the next element, or at the block's end; 0 on anything else,
 * a trailing comma included. */
static inline int next_element(Cur *c) {
    ws(c);
    if (c->p >= c->end) return 1;
    if (*c->p != ',') return 0;
    c->p++;
    ws(c);
    return c->p < c->end;
}

/* Any value, validated and skipped. */
static inline int skip(Cur *c, int depth) {
    const unsigned char *s;
    Py_ssize_t n;
    int flag;
    if (c->p >= c->end) return 0;
    switch (*c->p) {
    case '"':
        return string(c, &s, &n, &flag);
    case '{':
    case '[': {
        unsigned char close = *c->p == '{' ? '}' : ']';
        if (depth >= MAX_DEPTH) return 0;
        int more = open_container(c, close);
        while (more > 0) {
            if (close == '}' && !member_key(c, &s, &n, &flag)) return 0;
            if (!skip(c, depth + 1)) return 0;
            more = next_item(c, close);
        }
        return more == 0;
    }
    case 't':
        return literal(c, "true");
    case 'f':
        return literal(c, "false");
    case 'n':
        return literal(c, "null");
    default:
        return number(c, &s, &flag);
    }
}

/* Clinger's fast path: a decimal of at most 2^53 without its point, over a power of ten up
 * to 10^22 (both exact doubles), is one correctly rounded division: the same double as a
 * correctly rounded strtod (tests/test_native_scan.py checks it against float()). Most trace
 * times are such decimals (microseconds with 3 decimals); the rest go to PyOS_string_to_double. */
static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static inline int fast_double(const unsigned char *s, Py_ssize_t n, double *out) {
    const unsigned char *p = s, *e = s + n;
    int neg = 0, digits = 0, frac = 0, in_frac = 0;
    uint64_t m = 0;
    if (p < e && *p == '-') {
        neg = 1;
        p++;
    }
    for (; p < e; p++) {
        if (*p == '.') {
            in_frac = 1;
            continue;
        }
        if (*p < '0' || *p > '9') return 0;  /* an exponent: the slow path */
        if (++digits > 19) return 0;
        m = m * 10 + (uint64_t)(*p - '0');
        frac += in_frac;
    }
    while (frac > 0 && m % 10 == 0) {
        m /= 10;
        frac--;
    }
    if (m > ((uint64_t)1 << 53) || frac > 22) return 0;
    double v = (double)m / POW10[frac];
    *out = neg ? -v : v;
    return 1;
}

static inline int to_double(const unsigned char *s, Py_ssize_t n, double *out) {
    if (fast_double(s, n, out)) return 1;
    char text[NUMBER_CHARS];
    if (n >= NUMBER_CHARS) return 0;
    memcpy(text, s, n);
    text[n] = 0;
    char *end;
    *out = PyOS_string_to_double(text, &end, NULL);
    if (*out == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return end == text + n && isfinite(*out);
}

/* An integer literal of at most 18 digits (int64 without overflow checks). */
static inline int to_int(const unsigned char *s, Py_ssize_t n, long long *out) {
    int neg = n > 0 && *s == '-';
    if (n - neg > 18 || n - neg < 1) return 0;
    long long v = 0;
    for (Py_ssize_t i = neg; i < n; i++) v = v * 10 + (s[i] - '0');
    *out = neg ? -v : v;
    return 1;
}

static inline int key_is(const unsigned char *k, Py_ssize_t n, const char *word) {
    return (size_t)n == strlen(word) && !memcmp(k, word, n);
}

#endif
