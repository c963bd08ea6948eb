/*
 * propfilter: a flowd filter that keeps the messages whose property named by the parameter
 * "property" equals the parameter "value" (byte for byte). A message without the property is
 * dropped. Both parameters are required: without them flowd_init, and a filter call made
 * without flowd_init, return FLOWD_ERR_PARAMS.
 */
#include "flowd.h"

FLOWD_GUEST()

static flowd_buf params; /* a copy of the property name, then the value */
static flowd_str property, value;
static int configured;
static flowd_buf bitmap;

FLOWD_EXPORT("flowd_init") flowd_i32 flowd_init(flowd_i32 ptr, flowd_i32 len) {
  flowd_str p, v;
  int rc = flowd_params_get(ptr, len, "property", &p);
  if (rc < 0) return rc;
  if (rc == 0 || p.len == 0) return FLOWD_ERR_PARAMS;
  rc = flowd_params_get(ptr, len, "value", &v);
  if (rc < 0) return rc;
  if (rc == 0) return FLOWD_ERR_PARAMS;
  /* The input buffer is the host's: keep copies. */
  if (flowd_buf_reserve(&params, p.len + v.len) != 0) return FLOWD_ERR_NOMEM;
  flowd_copy(params.ptr, p.ptr, p.len);
  flowd_copy(params.ptr + p.len, v.ptr, v.len);
  property = (flowd_str){params.ptr, p.len};
  value = (flowd_str){params.ptr + p.len, v.len};
  configured = 1;
  return 0;
}

FLOWD_EXPORT("flowd_filter") flowd_i32 flowd_filter(flowd_i32 ptr, flowd_i32 len, flowd_i32 n) {
  if (!configured) return FLOWD_ERR_PARAMS;
  flowd_records in;
  if (flowd_records_init(&in, ptr, len, n) != 0) return FLOWD_ERR_INPUT;
  if (flowd_bitmap_reserve(&bitmap, (flowd_u32)n) != 0) return FLOWD_ERR_NOMEM;
  flowd_record rec;
  flowd_str got;
  for (flowd_u32 i = 0;; i++) {
    int rc = flowd_records_next(&in, &rec);
    if (rc == 0) break;
    if (rc < 0) return rc;
    if (flowd_props_get(rec.props, property, &got) && flowd_str_eq(got, value)) {
      flowd_bitmap_keep(&bitmap, i);
    }
  }
  return (flowd_i32)(unsigned long)bitmap.ptr;
}
