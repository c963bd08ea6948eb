package filter

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker/store"
)

// A program that builds its own Registry gets flowd's SQL92 engine through ParseSQL92, the
// engine being internal: a refused expression is an error and no selector (a nil interface,
// not a nil pointer in one), an accepted one filters on properties.
func TestParseSQL92(t *testing.T) {
	sel, err := ParseSQL92("amount >")
	require.Error(t, err)
	assert.True(t, sel == nil, "a refused expression gives a nil Selector, got %#v", sel)

	r := NewRegistry(0)
	r.Register(TypeSQL92, SQL92(ParseSQL92))
	_, err = r.Filter(context.Background(), Subscription{ExpressionType: TypeSQL92, Expression: "region ="})
	assert.Error(t, err)
	f, err := r.Filter(context.Background(), Subscription{ExpressionType: TypeSQL92, Expression: "region = 'eu' AND amount > 100"})
	require.NoError(t, err)
	cands := []store.Candidate{
		storedCandidate(t, 0, "a", map[string]string{"region": "eu", "amount": "150"}, 0),
		storedCandidate(t, 1, "b", map[string]string{"region": "eu", "amount": "50"}, 0),
		storedCandidate(t, 2, "c", map[string]string{"region": "us", "amount": "150"}, 0),
	}
	keep := make([]bool, len(cands))
	require.NoError(t, f.Match.MatchBatch(context.Background(), cands, keep))
	assert.Equal(t, []bool{true, false, false}, keep)
}
