// Package protocol is RocketMQ's "remoting" wire protocol as flowd speaks it: frames and their
// two header serializations, request and response codes, typed request and response headers,
// the stored message format, and the JSON bodies carried by some commands.
//
// The package holds no socket policy: it turns bytes into values and values into bytes. Both
// the broker and the clients import it; it imports neither.
//
// What is here:
//
//   - Command, AppendFrame, DecodeFrame and ReadFrame: frames with JSON or binary headers.
//     A sender may give a typed header as Command.Fields (a FieldAppender, such as
//     SendV2Fields) instead of an ExtFields map: its fields are written straight into the
//     encoded header, numbers formatted in place, without a map or a string per field.
//   - One typed header per request and response (headers.go), each with Encode, EncodeTo
//     and Decode; a decoding error is a *FieldError wrapping ErrMissingField or ErrBadField.
//     DecodeSendHeader reads both spellings of the send header.
//   - The stored message format (AppendStored, DecodeStored, PatchStored), batch entries
//     (AppendBatchEntry, DecodeBatch), offset message ids, zlib bodies, and TagsCode.
//   - The JSON bodies (bodies.go), accepting fastjson's non-standard object keys.
//
// # Notes
//
//   - Every decoder treats its input as hostile: lengths are checked against the bytes actually
//     present and against MaxFrameSize before anything is allocated, and errors name what was
//     wrong rather than panicking.
//   - Messages are stored and sent in the v1 layout (magic 0xDAA320A7): the Go RocketMQ client
//     cannot read v2's two-byte topic length.
//   - Encodings are deterministic (ext fields and properties in key order, then Fields in
//     the order their header writes them), so equal values give equal bytes.
//   - The package holds no mutable state; Compressor and Decompressor let callers keep zlib
//     state themselves.
package protocol
