package protocol

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// TagsCode is the tag hash a consume-queue unit stores and a subscription's codeSet lists:
// Java's String.hashCode of the TAGS property, widened to int64, and 0 for no tags.
//
// # Notes
//
// Java hashes UTF-16 code units of the string it decoded from the property bytes, so:
//
//   - a character outside the Basic Multilingual Plane counts as its two surrogates;
//   - invalid UTF-8 counts as U+FFFD once per malformed subsequence, as the JDK decoder
//     replaces it (for instance "\xE2\x82" before an ASCII byte is one U+FFFD, and so is the
//     UTF-8 encoding of a surrogate such as "\xED\xA0\x80").
//
// rocketmq-client-go's utils.HashString hashes UTF-8 bytes instead, which agrees for ASCII only.
// A broker must therefore compute codes for a subscription from its tagsSet with TagsCode, not
// trust the codeSet a Go client sent, or non-ASCII tags never match.
func TagsCode(tags string) int64 {
	var h int32
	for i := 0; i < len(tags); {
		c := tags[i]
		if c < utf8.RuneSelf {
			h = 31*h + int32(c)
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(tags[i:])
		if r == utf8.RuneError && size <= 1 {
			h = 31*h + utf8.RuneError
			i += javaMalformedLen(tags[i:])
			continue
		}
		if r >= 0x10000 {
			r -= 0x10000
			h = 31*h + int32(0xD800+(r>>10))
			h = 31*h + int32(0xDC00+(r&0x3FF))
		} else {
			h = 31*h + r
		}
		i += size
	}
	return int64(h)
}

// javaMalformedLen is how many bytes of s, which starts with a byte Go's decoder rejected, the
// JDK's UTF-8 decoder replaces with a single U+FFFD. It follows the Unicode "maximal subpart"
// practice, except that the JDK accepts ED A0–BF as the start of a three-byte sequence and
// then rejects the whole encoded surrogate at once. The end of s counts as a byte that does not
// continue the sequence; a property value is always followed by a separator in Java's view.
func javaMalformedLen(s string) int {
	cont := func(i int) bool { return i < len(s) && s[i]&0xC0 == 0x80 }
	b1 := s[0]
	switch {
	case b1 >= 0xE0 && b1 <= 0xEF:
		if !cont(1) || (b1 == 0xE0 && s[1] < 0xA0) {
			return 1
		}
		if !cont(2) {
			return 2
		}
		return 3 // a well-formed shape Go still rejected: an encoded surrogate
	case b1 >= 0xF0 && b1 <= 0xF4:
		if !cont(1) || (b1 == 0xF0 && s[1] < 0x90) || (b1 == 0xF4 && s[1] > 0x8F) {
			return 1
		}
		if !cont(2) {
			return 2
		}
		return 3 // the fourth byte is missing or does not continue
	}
	return 1 // a stray continuation byte, C0, C1, F5–FF, or a two-byte lead without its tail
}

// ParseTagExpression splits a tag subscription expression as RocketMQ does: "*" or an empty
// expression takes every message (nil); otherwise tags are separated by "||", trimmed, and
// empty or repeated ones dropped.
func ParseTagExpression(expr string) []string {
	expr = strings.TrimSpace(expr)
	if expr == "" || expr == "*" {
		return nil
	}
	var tags []string
	for _, t := range strings.Split(expr, "||") {
		if t = strings.TrimSpace(t); t != "" && !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	return tags
}
