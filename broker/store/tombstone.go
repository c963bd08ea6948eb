package store

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// deletedFile records the topics DeleteTopic removed, each with the commit-log write position
// at its deletion: every message of the topic below that position belongs to the deleted
// topic. Recovery that re-dispatches from the commit log (after a crash with a missing or
// damaged checkpoint it re-dispatches the whole log) skips those messages, so a deleted topic
// does not come back. A record is dropped once retention removed every segment below it.
//
// The file is text, one "<offset> <topic>" line per topic, replaced atomically.
const deletedFile = "deleted"

// tombstones maps a deleted topic to the commit-log offset below which its messages are dead.
type tombstones map[string]int64

// buried reports whether the message of topic at commit-log offset at was deleted.
func (t tombstones) buried(topic []byte, at int64) bool {
	if len(t) == 0 {
		return false
	}
	below, ok := t[string(topic)]
	return ok && at < below
}

// loadTombstones reads the deleted-topic records; a missing file means none.
func (s *Store) loadTombstones() (tombstones, error) {
	path := filepath.Join(s.dir, deletedFile)
	f, err := s.fs.OpenFile(path, os.O_RDONLY, 0)
	if isNotExist(err) {
		return tombstones{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open deleted-topic records: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat deleted-topic records: %w", err)
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil && err != io.EOF {
		return nil, readFailure(&s.readErrors, fmt.Errorf("read deleted-topic records: %w", err))
	}
	t := tombstones{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		off, topic, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.ParseInt(off, 10, 64)
		if !ok || err != nil || !validTopic(topic) {
			// The file is replaced atomically, so this is damage, not a torn write: keeping
			// the records that parse is all that can be done.
			s.log.Warn("ignoring a damaged deleted-topic record", "line", sc.Text())
			continue
		}
		t[topic] = max(t[topic], n)
	}
	return t, nil
}

// writeTombstones replaces the deleted-topic records: temporary file, fsync, rename, fsync
// of the directory, so that the record is durable before the topic's files go.
func (s *Store) writeTombstones(t tombstones) error {
	path := filepath.Join(s.dir, deletedFile)
	if len(t) == 0 {
		if err := s.fs.Remove(path); err != nil && !isNotExist(err) {
			return fmt.Errorf("remove deleted-topic records: %w", err)
		}
		return s.fs.SyncDir(s.dir)
	}
	topics := make([]string, 0, len(t))
	for topic := range t {
		topics = append(topics, topic)
	}
	slices.Sort(topics)
	var buf bytes.Buffer
	for _, topic := range topics {
		fmt.Fprintf(&buf, "%d %s\n", t[topic], topic)
	}
	tmp := path + ".tmp"
	f, err := s.fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("write deleted-topic records: %w", err)
	}
	_, err = f.Write(buf.Bytes())
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = s.fs.Rename(tmp, path)
	}
	if err == nil {
		err = s.fs.SyncDir(s.dir)
	}
	if err != nil {
		s.fs.Remove(tmp)
		return fmt.Errorf("write deleted-topic records: %w", err)
	}
	return nil
}

// pruneTombstones drops records whose messages retention has removed (all below minOffset).
func (t tombstones) prune(minOffset int64) bool {
	changed := false
	for topic, below := range t {
		if below <= minOffset {
			delete(t, topic)
			changed = true
		}
	}
	return changed
}
