package sql92

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The expectations are those of Java's Integer.parseInt, Long.parseLong, Double.valueOf
// and Boolean.valueOf.

func TestParseJavaInt(t *testing.T) {
	cases := []struct {
		s    string
		is32 bool
		want int64
		ok   bool
	}{
		{"0", true, 0, true},
		{"42", true, 42, true},
		{"+42", true, 42, true},
		{"-42", true, -42, true},
		{"007", true, 7, true},
		{"2147483647", true, math.MaxInt32, true},
		{"-2147483648", true, math.MinInt32, true},
		{"2147483648", true, 0, false},
		{"-2147483649", true, 0, false},
		{"2147483648", false, 2147483648, true},
		{"9223372036854775807", false, math.MaxInt64, true},
		{"-9223372036854775808", false, math.MinInt64, true},
		{"9223372036854775808", false, 0, false},
		{"99999999999999999999", false, 0, false},
		{"\u0661\u0662", true, 12, true}, // Arabic-Indic digits
		{"\uff13", true, 3, true},        // fullwidth three
		{"\U0001D7CF", true, 0, false},   // outside the BMP: a surrogate pair in Java
		{"", true, 0, false},
		{"-", true, 0, false},
		{"+", true, 0, false},
		{"--1", true, 0, false},
		{" 1", true, 0, false},
		{"1 ", true, 0, false},
		{"1.0", true, 0, false},
		{"1e3", true, 0, false},
		{"0x10", true, 0, false},
		{"1_000", true, 0, false},
		{"\xff", true, 0, false},
	}
	for _, c := range cases {
		got, ok := parseJavaInt(c.s, c.is32)
		assert.Equal(t, c.ok, ok, "%q", c.s)
		if c.ok {
			assert.Equal(t, c.want, got, "%q", c.s)
		}
	}
}

func TestParseJavaDouble(t *testing.T) {
	cases := []struct {
		s    string
		want float64
		ok   bool
	}{
		{"1.5", 1.5, true},
		{"-1.5", -1.5, true},
		{"+1.5", 1.5, true},
		{"1", 1, true},
		{"1.", 1, true},
		{".5", 0.5, true},
		{"1e3", 1000, true},
		{"1E+3", 1000, true},
		{"1.5e-3", 0.0015, true},
		{" \t1.5\n", 1.5, true},
		{"\x001.5\x1f", 1.5, true},
		{"1.5f", 1.5, true},
		{"1.5D", 1.5, true},
		{"1e400", math.Inf(1), true},
		{"-1e400", math.Inf(-1), true},
		{"1e-400", 0, true},
		{"Infinity", math.Inf(1), true},
		{"-Infinity", math.Inf(-1), true},
		{"0x1.8p1", 3, true},
		{"0X10P0", 16, true},
		{"-0x.8p1d", -1, true},
		{"", 0, false},
		{"  ", 0, false},
		{".", 0, false},
		{"e3", 0, false},
		{"1e", 0, false},
		{"1e+", 0, false},
		{"1.5ff", 0, false},
		{"f", 0, false},
		{"inf", 0, false},
		{"infinity", 0, false},
		{"nan", 0, false},
		{"Infinityf", 0, false},
		{"0x10", 0, false}, // Java wants the binary exponent
		{"0x1p", 0, false},
		{"0xp1", 0, false},
		{"1_0", 0, false},
		{"1,5", 0, false},
		{"\u00a01.5", 0, false}, // no-break space is not trimmed
		{"\u0661", 0, false},
	}
	for _, c := range cases {
		got, ok := parseJavaDouble(c.s)
		assert.Equal(t, c.ok, ok, "%q", c.s)
		if c.ok {
			assert.Equal(t, c.want, got, "%q", c.s)
		}
	}
	nan, ok := parseJavaDouble("-NaN")
	assert.True(t, ok)
	assert.True(t, math.IsNaN(nan))
}

func TestJavaBool(t *testing.T) {
	for s, want := range map[string]bool{
		"true": true, "TRUE": true, "tRuE": true, "false": false, "1": false, "yes": false,
		"": false, " true": false, "truee": false,
	} {
		assert.Equal(t, want, javaBool(s), "%q", s)
	}
}

func TestCompareDouble(t *testing.T) {
	nan := math.NaN()
	negZero := math.Copysign(0, -1)
	assert.Equal(t, -1, compareDouble(negZero, 0))
	assert.Equal(t, 1, compareDouble(0, negZero))
	assert.Equal(t, 0, compareDouble(nan, nan))
	assert.Equal(t, 1, compareDouble(nan, math.Inf(1)))
	assert.Equal(t, -1, compareDouble(math.Inf(1), nan))
	assert.Equal(t, -1, compareDouble(1, 2))
	assert.Equal(t, 0, compareDouble(2, 2))
}
