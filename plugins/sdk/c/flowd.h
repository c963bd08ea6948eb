/*
 * flowd.h - the flowd plugin ABI, version 1, for guests written in C.
 *
 * A single header with no dependencies: it needs neither libc nor a WASI sysroot, so a guest
 * builds with clang and lld alone:
 *
 *     clang --target=wasm32 -nostdlib -O2 -mbulk-memory -I plugins/sdk/c \
 *         -Wl,--no-entry -Wl,--strip-all -o guest.wasm guest.c
 *
 * -mbulk-memory (or -fno-builtin) is needed: without libc there is no memset or memcpy, and
 * clang turns the header's clear and copy loops into calls to them unless it may use
 * memory.fill and memory.copy instead.
 *
 * plugins/ABI.md is the contract; this header implements the parts every guest repeats:
 *
 *   - FLOWD_GUEST() defines the exports every guest has: flowd_abi_version and flowd_alloc
 *     (the host's input buffer). A guest adds flowd_init if it takes parameters, and the
 *     export of its kind (flowd_filter, flowd_allocate or flowd_transform) with
 *     FLOWD_EXPORT("name").
 *   - flowd_records_next() decodes the filter and transform input one record at a time,
 *     checking every length against the input, so a malformed batch is an error code
 *     (FLOWD_ERR_INPUT), never a read past the input or a trap.
 *   - flowd_props_get() looks a property up in RocketMQ's encoding; flowd_params_get() looks a
 *     parameter up in flowd_init's input.
 *   - flowd_assign_decode() checks an allocator's input whole; flowd_queue_next(),
 *     flowd_member_next(), flowd_member_label() and flowd_assign_previous() walk it.
 *   - flowd_buf_reserve() grows a buffer in guest memory without malloc, for output and for
 *     the copies of parameters a guest keeps.
 *
 * Memory: buffers are carved from the end of linear memory with memory.grow. A buffer that is
 * the last one carved grows in place; otherwise a larger one is carved and the old one is
 * left unused. Buffers at least double when they grow, so the waste stays below the size of
 * the largest buffer. The host caps memory (the manifest's limits.memory_pages); past the cap
 * memory.grow fails and so do flowd_alloc (0) and flowd_buf_reserve (FLOWD_ERR_NOMEM).
 *
 * The functions are static: a guest is one translation unit, and the linker drops what it
 * does not use.
 */
#ifndef FLOWD_H
#define FLOWD_H

#if !defined(__wasm32__)
#error "flowd.h targets wasm32 (clang --target=wasm32)"
#endif

typedef unsigned char flowd_u8;
typedef unsigned short flowd_u16;
typedef unsigned int flowd_u32;
typedef int flowd_i32;
typedef unsigned long long flowd_u64;
typedef long long flowd_i64;

/* The ABI version this header speaks; flowd_abi_version returns it. */
#define FLOWD_ABI_VERSION 1

/* Error codes (plugins/ABI.md, "Error codes"): returned instead of a result. */
#define FLOWD_ERR_GENERIC (-1)     /* the guest failed for its own reason */
#define FLOWD_ERR_INPUT (-2)       /* the input could not be decoded */
#define FLOWD_ERR_NOMEM (-3)       /* the guest ran out of memory */
#define FLOWD_ERR_PARAMS (-4)      /* a parameter is missing or invalid */
#define FLOWD_ERR_UNSUPPORTED (-5) /* the guest cannot handle this input */

/* FLOWD_EXPORT("name") exports a function under that name, whatever the linker flags. */
#define FLOWD_EXPORT(name) __attribute__((export_name(name), visibility("default")))

/* A byte string in guest memory: not NUL-terminated, not necessarily UTF-8. */
typedef struct {
  const flowd_u8 *ptr;
  flowd_u32 len;
} flowd_str;

/* ---- little-endian reads at any alignment ---- */

static inline flowd_u16 flowd_u16le(const flowd_u8 *p) {
  return (flowd_u16)(p[0] | (p[1] << 8));
}

static inline flowd_u32 flowd_u32le(const flowd_u8 *p) {
  return (flowd_u32)p[0] | ((flowd_u32)p[1] << 8) | ((flowd_u32)p[2] << 16) | ((flowd_u32)p[3] << 24);
}

static inline flowd_u64 flowd_u64le(const flowd_u8 *p) {
  return (flowd_u64)flowd_u32le(p) | ((flowd_u64)flowd_u32le(p + 4) << 32);
}

static inline void flowd_put_u16le(flowd_u8 *p, flowd_u16 v) {
  p[0] = (flowd_u8)v;
  p[1] = (flowd_u8)(v >> 8);
}

static inline void flowd_put_u32le(flowd_u8 *p, flowd_u32 v) {
  p[0] = (flowd_u8)v;
  p[1] = (flowd_u8)(v >> 8);
  p[2] = (flowd_u8)(v >> 16);
  p[3] = (flowd_u8)(v >> 24);
}

/* ---- strings ---- */

static inline int flowd_str_eq(flowd_str a, flowd_str b) {
  if (a.len != b.len) return 0;
  for (flowd_u32 i = 0; i < a.len; i++) {
    if (a.ptr[i] != b.ptr[i]) return 0;
  }
  return 1;
}

/* flowd_str_eqz compares s with a NUL-terminated literal. */
static inline int flowd_str_eqz(flowd_str s, const char *z) {
  flowd_u32 i = 0;
  for (; z[i] != 0; i++) {
    if (i >= s.len || s.ptr[i] != (flowd_u8)z[i]) return 0;
  }
  return i == s.len;
}

static inline void flowd_copy(flowd_u8 *dst, const flowd_u8 *src, flowd_u32 n) {
  for (flowd_u32 i = 0; i < n; i++) dst[i] = src[i];
}

static inline void flowd_zero(flowd_u8 *dst, flowd_u32 n) {
  for (flowd_u32 i = 0; i < n; i++) dst[i] = 0;
}

/* ---- memory ---- */

/* A growable buffer in guest memory. Start from {0, 0}. */
typedef struct {
  flowd_u8 *ptr;
  flowd_u32 cap;
} flowd_buf;

#define FLOWD_PAGE 65536u

/*
 * flowd_buf_reserve makes b hold at least size bytes. Its contents are not kept when it
 * moves. Returns 0, or FLOWD_ERR_NOMEM when memory cannot grow.
 */
static inline int flowd_buf_reserve(flowd_buf *b, flowd_u32 size) {
  if (size <= b->cap) return 0;
  flowd_u32 want = b->cap * 2u;
  if (want < size) want = size;
  if (want < 1024u) want = 1024u;
  flowd_u32 end = (flowd_u32)__builtin_wasm_memory_size(0) * FLOWD_PAGE;
  flowd_u32 base = (flowd_u32)(unsigned long)b->ptr;
  int last = b->ptr != 0 && base + b->cap == end; /* grow in place */
  flowd_u32 extra = last ? want - b->cap : want;
  flowd_u32 pages = (extra + FLOWD_PAGE - 1u) / FLOWD_PAGE;
  if (pages > 32768u) return FLOWD_ERR_NOMEM;
  if (__builtin_wasm_memory_grow(0, pages) == (unsigned long)-1) return FLOWD_ERR_NOMEM;
  if (!last) base = end;
  b->ptr = (flowd_u8 *)(unsigned long)base;
  b->cap = (last ? b->cap : 0u) + pages * FLOWD_PAGE;
  return 0;
}

/*
 * FLOWD_GUEST() defines flowd_abi_version and flowd_alloc, and flowd_input, the buffer
 * flowd_alloc hands the host. Put it once in a guest, at file scope.
 */
#define FLOWD_GUEST()                                                    \
  static flowd_buf flowd_input;                                         \
  FLOWD_EXPORT("flowd_abi_version") flowd_i32 flowd_abi_version(void) { \
    return FLOWD_ABI_VERSION;                                           \
  }                                                                     \
  FLOWD_EXPORT("flowd_alloc") flowd_i32 flowd_alloc(flowd_i32 size) {   \
    if (size < 0) return 0;                                             \
    /* Never 0 for a size of 0 either: 0 means out of memory. */        \
    if (size == 0) size = 1;                                            \
    if (flowd_buf_reserve(&flowd_input, (flowd_u32)size) != 0) return 0; \
    return (flowd_i32)(unsigned long)flowd_input.ptr;                   \
  }

/* ---- message records (filter and transform input) ---- */

typedef struct {
  flowd_i32 queue_id;
  flowd_i64 queue_offset;
  flowd_i64 store_timestamp_ms;
  flowd_str topic;
  flowd_str tags;
  flowd_str keys;  /* keys separated by one space */
  flowd_str props; /* RocketMQ encoding: key 0x01 value 0x02, repeated */
  flowd_str body;  /* empty unless the manifest asks for bodies (filter) */
} flowd_record;

/* A cursor over n records in len bytes at ptr. */
typedef struct {
  const flowd_u8 *p;
  const flowd_u8 *end;
  flowd_u32 left; /* records still to read */
} flowd_records;

static inline int flowd_records_init(flowd_records *r, flowd_i32 ptr, flowd_i32 len, flowd_i32 n) {
  if (ptr < 0 || len < 0 || n < 0) return FLOWD_ERR_INPUT;
  r->p = (const flowd_u8 *)(unsigned long)(flowd_u32)ptr;
  r->end = r->p + (flowd_u32)len;
  r->left = (flowd_u32)n;
  return 0;
}

/* flowd_take_str reads a u16 (wide == 0) or u32 (wide != 0) length and that many bytes. */
static inline int flowd_take_str(const flowd_u8 **p, const flowd_u8 *end, int wide, flowd_str *s) {
  flowd_u32 hdr = wide ? 4u : 2u;
  if ((flowd_u32)(end - *p) < hdr) return FLOWD_ERR_INPUT;
  flowd_u32 n = wide ? flowd_u32le(*p) : flowd_u16le(*p);
  *p += hdr;
  if ((flowd_u32)(end - *p) < n) return FLOWD_ERR_INPUT;
  s->ptr = *p;
  s->len = n;
  *p += n;
  return 0;
}

/*
 * flowd_records_next decodes the next record into rec. Returns 1 for a record, 0 when all n
 * were read and the input is used up exactly, or FLOWD_ERR_INPUT: a length runs past its
 * record or the input, the input ends before n records, or bytes are left after them. Bytes
 * after a record's last field and within its record_len are skipped (later ABI versions may
 * append fields).
 */
static inline int flowd_records_next(flowd_records *r, flowd_record *rec) {
  if (r->left == 0) return r->p == r->end ? 0 : FLOWD_ERR_INPUT;
  if ((flowd_u32)(r->end - r->p) < 4u) return FLOWD_ERR_INPUT;
  flowd_u32 rlen = flowd_u32le(r->p);
  const flowd_u8 *p = r->p + 4;
  if ((flowd_u32)(r->end - p) < rlen) return FLOWD_ERR_INPUT;
  const flowd_u8 *end = p + rlen;
  if (rlen < 20u) return FLOWD_ERR_INPUT;
  rec->queue_id = (flowd_i32)flowd_u32le(p);
  rec->queue_offset = (flowd_i64)flowd_u64le(p + 4);
  rec->store_timestamp_ms = (flowd_i64)flowd_u64le(p + 12);
  p += 20;
  if (flowd_take_str(&p, end, 0, &rec->topic) || flowd_take_str(&p, end, 0, &rec->tags) ||
      flowd_take_str(&p, end, 0, &rec->keys) || flowd_take_str(&p, end, 1, &rec->props) ||
      flowd_take_str(&p, end, 1, &rec->body)) {
    return FLOWD_ERR_INPUT;
  }
  r->p = end;
  r->left--;
  return 1;
}

/*
 * flowd_find returns the first byte equal to c in [p, end), or end. It reads eight bytes at a
 * time (properties are scanned for every message, so this is the filter's inner loop).
 */
static inline const flowd_u8 *flowd_find(const flowd_u8 *p, const flowd_u8 *end, flowd_u8 c) {
  const flowd_u64 ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
  const flowd_u64 pattern = ones * c;
  while (end - p >= 8) {
    flowd_u64 w = flowd_u64le(p) ^ pattern; /* a zero byte where p[i] == c */
    flowd_u64 hit = (w - ones) & ~w & highs;
    if (hit) return p + (__builtin_ctzll(hit) >> 3);
    p += 8;
  }
  while (p < end && *p != c) p++;
  return p;
}

/*
 * flowd_props_get finds the property named key in props (RocketMQ's encoding). Returns 1 and
 * sets *value when found, 0 when not. A trailing pair without its 0x02 still counts (the
 * value runs to the end), as RocketMQ's own decoder reads it.
 */
static inline int flowd_props_get(flowd_str props, flowd_str key, flowd_str *value) {
  const flowd_u8 *p = props.ptr, *end = props.ptr + props.len;
  while (p < end) {
    const flowd_u8 *sep = flowd_find(p, end, 0x01);
    if (sep == end) return 0; /* a name without a value */
    flowd_str name = {p, (flowd_u32)(sep - p)};
    const flowd_u8 *v = sep + 1;
    p = flowd_find(v, end, 0x02);
    if (flowd_str_eq(name, key)) {
      value->ptr = v;
      value->len = (flowd_u32)(p - v);
      return 1;
    }
    if (p < end) p++;
  }
  return 0;
}

/* ---- parameters (flowd_init input) ---- */

/*
 * flowd_params_get finds the parameter named key in flowd_init's input. Returns 1 and sets
 * *value when found, 0 when not, FLOWD_ERR_INPUT when the input does not decode. value points
 * into the input buffer, which the host reuses: copy what you keep (flowd_buf_reserve).
 */
static inline int flowd_params_get(flowd_i32 ptr, flowd_i32 len, const char *key, flowd_str *value) {
  if (ptr < 0 || len < 0) return FLOWD_ERR_INPUT;
  const flowd_u8 *p = (const flowd_u8 *)(unsigned long)(flowd_u32)ptr;
  const flowd_u8 *end = p + (flowd_u32)len;
  if (len < 4) return FLOWD_ERR_INPUT;
  flowd_u32 count = flowd_u32le(p);
  p += 4;
  int found = 0;
  for (flowd_u32 i = 0; i < count; i++) {
    flowd_str k, v;
    if (flowd_take_str(&p, end, 0, &k) || flowd_take_str(&p, end, 1, &v)) return FLOWD_ERR_INPUT;
    if (!found && flowd_str_eqz(k, key)) {
      *value = v;
      found = 1;
    }
  }
  if (p != end) return FLOWD_ERR_INPUT;
  return found;
}

/* ---- filter output ---- */

/*
 * flowd_bitmap_reserve makes b hold the bitmap of n messages, all bits clear (drop). Returns
 * 0 or FLOWD_ERR_NOMEM.
 */
static inline int flowd_bitmap_reserve(flowd_buf *b, flowd_u32 n) {
  flowd_u32 size = (n + 7u) / 8u;
  int err = flowd_buf_reserve(b, size);
  if (err) return err;
  flowd_zero(b->ptr, size);
  return 0;
}

/* flowd_bitmap_keep sets bit i: keep message i. */
static inline void flowd_bitmap_keep(flowd_buf *b, flowd_u32 i) {
  b->ptr[i >> 3] |= (flowd_u8)(1u << (i & 7u));
}

/* ---- transform output ---- */

/* A transform's output being written: a buffer and how much of it is used. */
typedef struct {
  flowd_buf buf;
  flowd_u32 len;
  flowd_u32 count_at; /* offset of the current input message's count */
} flowd_out;

static inline int flowd_out_grow(flowd_out *o, flowd_u32 more) {
  if (more > 0x7fffffffu - o->len) return FLOWD_ERR_NOMEM;
  flowd_u32 need = o->len + more;
  if (need <= o->buf.cap) return 0;
  flowd_buf nb = o->buf;
  int err = flowd_buf_reserve(&nb, need);
  if (err) return err;
  if (nb.ptr != o->buf.ptr) flowd_copy(nb.ptr, o->buf.ptr, o->len);
  o->buf = nb;
  return 0;
}

/* flowd_out_reset starts a new output; the buffer is kept for the next call. */
static inline void flowd_out_reset(flowd_out *o) { o->len = 0; }

/* flowd_out_begin starts the messages out for the next message in (count 0 so far). */
static inline int flowd_out_begin(flowd_out *o) {
  int err = flowd_out_grow(o, 4);
  if (err) return err;
  o->count_at = o->len;
  flowd_put_u32le(o->buf.ptr + o->len, 0);
  o->len += 4;
  return 0;
}

/* flowd_out_message appends one message out and counts it. */
static inline int flowd_out_message(flowd_out *o, flowd_str tags, flowd_str keys, flowd_str props, flowd_str body) {
  if (tags.len > 0xffffu || keys.len > 0xffffu) return FLOWD_ERR_INPUT;
  flowd_u32 size = 2u + tags.len + 2u + keys.len;
  if (props.len > 0x7fffffffu - size - 8u) return FLOWD_ERR_NOMEM;
  size += 4u + props.len;
  if (body.len > 0x7fffffffu - size - 4u) return FLOWD_ERR_NOMEM;
  size += 4u + body.len;
  int err = flowd_out_grow(o, size);
  if (err) return err;
  flowd_u8 *p = o->buf.ptr + o->len;
  flowd_put_u16le(p, (flowd_u16)tags.len);
  flowd_copy(p + 2, tags.ptr, tags.len);
  p += 2 + tags.len;
  flowd_put_u16le(p, (flowd_u16)keys.len);
  flowd_copy(p + 2, keys.ptr, keys.len);
  p += 2 + keys.len;
  flowd_put_u32le(p, props.len);
  flowd_copy(p + 4, props.ptr, props.len);
  p += 4 + props.len;
  flowd_put_u32le(p, body.len);
  flowd_copy(p + 4, body.ptr, body.len);
  o->len += size;
  flowd_u8 *c = o->buf.ptr + o->count_at;
  flowd_put_u32le(c, flowd_u32le(c) + 1u);
  return 0;
}

/* ---- allocator input ---- */

/* One queue of an allocator's input. */
typedef struct {
  flowd_str topic;
  flowd_str broker;
  flowd_i32 queue_id;
} flowd_queue;

/* One member of an allocator's input. */
typedef struct {
  flowd_str id;
  flowd_u32 weight; /* 1 when the host knows nothing else */
  flowd_str room;   /* empty when the host knows nothing else */
  flowd_u32 nlabels;
  const flowd_u8 *labels; /* nlabels × (u16 key, u16 value), sorted by key: flowd_member_label */
} flowd_member;

/*
 * An allocator's input, checked whole by flowd_assign_decode, so walking it afterwards
 * (flowd_queue_next, flowd_member_next, flowd_assign_previous) needs no further checks.
 */
typedef struct {
  flowd_str group;
  flowd_u32 nq;
  const flowd_u8 *queues; /* walk with flowd_queue_next */
  flowd_u32 nm;
  const flowd_u8 *members; /* walk with flowd_member_next */
  flowd_u32 np;            /* nq, or 0 without a previous assignment */
  const flowd_u8 *previous;
} flowd_assign_input;

static inline int flowd_skip(const flowd_u8 **p, const flowd_u8 *end, flowd_u32 n) {
  if ((flowd_u32)(end - *p) < n) return FLOWD_ERR_INPUT;
  *p += n;
  return 0;
}

/*
 * flowd_assign_decode checks the whole input of flowd_allocate and fills in. Returns 0 or
 * FLOWD_ERR_INPUT (a length past the input, np neither 0 nor nq, bytes left over).
 */
static inline int flowd_assign_decode(flowd_i32 ptr, flowd_i32 len, flowd_assign_input *in) {
  if (ptr < 0 || len < 0) return FLOWD_ERR_INPUT;
  const flowd_u8 *p = (const flowd_u8 *)(unsigned long)(flowd_u32)ptr;
  const flowd_u8 *end = p + (flowd_u32)len;
  flowd_str s;
  if (flowd_take_str(&p, end, 0, &in->group)) return FLOWD_ERR_INPUT;
  if (flowd_skip(&p, end, 4)) return FLOWD_ERR_INPUT;
  in->nq = flowd_u32le(p - 4);
  in->queues = p;
  for (flowd_u32 i = 0; i < in->nq; i++) {
    if (flowd_take_str(&p, end, 0, &s) || flowd_take_str(&p, end, 0, &s) || flowd_skip(&p, end, 4)) {
      return FLOWD_ERR_INPUT;
    }
  }
  if (flowd_skip(&p, end, 4)) return FLOWD_ERR_INPUT;
  in->nm = flowd_u32le(p - 4);
  in->members = p;
  for (flowd_u32 i = 0; i < in->nm; i++) {
    if (flowd_take_str(&p, end, 0, &s) || flowd_skip(&p, end, 4) || flowd_take_str(&p, end, 0, &s) ||
        flowd_skip(&p, end, 4)) {
      return FLOWD_ERR_INPUT;
    }
    flowd_u32 nl = flowd_u32le(p - 4);
    for (flowd_u32 j = 0; j < nl; j++) {
      if (flowd_take_str(&p, end, 0, &s) || flowd_take_str(&p, end, 0, &s)) return FLOWD_ERR_INPUT;
    }
  }
  if (flowd_skip(&p, end, 4)) return FLOWD_ERR_INPUT;
  in->np = flowd_u32le(p - 4);
  if (in->np != 0 && in->np != in->nq) return FLOWD_ERR_INPUT;
  in->previous = p;
  if ((flowd_u32)(end - p) / 4u < in->np) return FLOWD_ERR_INPUT;
  p += in->np * 4u;
  return p == end ? 0 : FLOWD_ERR_INPUT;
}

/* flowd_queue_next decodes the queue at *cursor (start at in->queues) and advances. */
static inline void flowd_queue_next(const flowd_u8 **cursor, flowd_queue *q) {
  const flowd_u8 *p = *cursor;
  q->topic = (flowd_str){p + 2, flowd_u16le(p)};
  p += 2 + q->topic.len;
  q->broker = (flowd_str){p + 2, flowd_u16le(p)};
  p += 2 + q->broker.len;
  q->queue_id = (flowd_i32)flowd_u32le(p);
  *cursor = p + 4;
}

/* flowd_member_next decodes the member at *cursor (start at in->members) and advances. */
static inline void flowd_member_next(const flowd_u8 **cursor, flowd_member *m) {
  const flowd_u8 *p = *cursor;
  m->id = (flowd_str){p + 2, flowd_u16le(p)};
  p += 2 + m->id.len;
  m->weight = flowd_u32le(p);
  p += 4;
  m->room = (flowd_str){p + 2, flowd_u16le(p)};
  p += 2 + m->room.len;
  m->nlabels = flowd_u32le(p);
  p += 4;
  m->labels = p;
  for (flowd_u32 j = 0; j < m->nlabels; j++) {
    p += 2 + flowd_u16le(p);
    p += 2 + flowd_u16le(p);
  }
  *cursor = p;
}

/* flowd_member_label finds a member's label by key: 1 and *value when found, else 0. */
static inline int flowd_member_label(const flowd_member *m, flowd_str key, flowd_str *value) {
  const flowd_u8 *p = m->labels;
  for (flowd_u32 j = 0; j < m->nlabels; j++) {
    flowd_str k = {p + 2, flowd_u16le(p)};
    p += 2 + k.len;
    flowd_str v = {p + 2, flowd_u16le(p)};
    p += 2 + v.len;
    if (flowd_str_eq(k, key)) {
      *value = v;
      return 1;
    }
  }
  return 0;
}

/* flowd_assign_previous is the previous owner of queue k: a member index, or -1 for none
 * (also when there is no previous assignment). */
static inline flowd_i32 flowd_assign_previous(const flowd_assign_input *in, flowd_u32 k) {
  if (k >= in->np) return -1;
  return (flowd_i32)flowd_u32le(in->previous + 4u * k);
}

/* flowd_pack packs a result for flowd_transform and flowd_allocate: (ptr << 32) | len. */
static inline flowd_i64 flowd_pack(const void *ptr, flowd_u32 len) {
  return (flowd_i64)(((flowd_u64)(unsigned long)ptr << 32) | (flowd_u64)len);
}

#endif /* FLOWD_H */
