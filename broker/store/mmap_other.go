//go:build !linux

package store

import "github.com/flowd-io/flowd/broker/store/vfs"

func mapSegment(vfs.File, int64) ([]byte, error) { return nil, nil }

func unmapSegment([]byte) error { return nil }

func mapSparse(vfs.File, int64) ([]byte, error) { return nil, nil }

func prefault([]byte) error { return nil }
