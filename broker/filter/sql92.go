package filter

import "github.com/flowd-io/flowd/internal/sql92"

// ParseSQL92 compiles expr with flowd's SQL92 engine, the one the broker's default Registry
// uses: RocketMQ's MessageSelector.bySql grammar, checked the way RocketMQ's broker checks a
// subscription. It is the parser SQL92 takes, for a program that builds its own Registry
// (to add a Wasm filter type, say) and keeps SQL92:
//
//	reg.Register(filter.TypeSQL92, filter.SQL92(filter.ParseSQL92))
//
// The engine itself is internal; a syntax error names the position and what was expected.
func ParseSQL92(expr string) (Selector, error) {
	sel, err := sql92.Compile(expr)
	if err != nil {
		return nil, err // not a nil *sql92.Selector in a non-nil Selector
	}
	return sel, nil
}
