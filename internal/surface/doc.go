// Package surface holds no code: its test checks that no exported identifier of a public
// flowd package mentions a type of an internal package, so that the public surface written
// down in RATIONALE.md ("Public surface") stays what it says. Moving a package under
// internal/ is only a promise to users if nothing public hands them its types.
package surface
