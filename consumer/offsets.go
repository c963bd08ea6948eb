package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/flowd-io/flowd/internal/atomicfile"
	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// offsetStore is where a group's consume offsets live: on the broker in clustering, in a
// local file in broadcasting.
type offsetStore interface {
	// read returns the stored offset of mq, or -1 when there is none.
	read(ctx context.Context, mq MessageQueue) (int64, error)
	// persist stores offsets. It returns the queues it could not store, with the errors.
	persist(ctx context.Context, offsets map[MessageQueue]int64) (failed map[MessageQueue]error)
}

// remoteStore keeps offsets on the broker (QUERY_CONSUMER_OFFSET / UPDATE_CONSUMER_OFFSET).
type remoteStore struct {
	cl    *clientcore.Client
	group string
}

func (s *remoteStore) read(ctx context.Context, mq MessageQueue) (int64, error) {
	addr, err := s.cl.FindBrokerAddr(ctx, mq.BrokerName, mq.Topic)
	if err != nil {
		return 0, err
	}
	no := false
	h := protocol.QueryConsumerOffsetRequestHeader{ConsumerGroup: s.group, Topic: mq.Topic, QueueID: int32(mq.QueueID), SetZeroIfNotFound: &no, BrokerName: mq.BrokerName}
	resp, err := s.cl.Invoke(ctx, addr, protocol.NewRequestWith(protocol.QueryConsumerOffset, &h, nil))
	if err != nil {
		return 0, fmt.Errorf("query offset of %s: %w", mq, err)
	}
	switch resp.ResponseCode() {
	case protocol.Success:
	case protocol.QueryNotFound:
		return -1, nil
	default:
		return 0, fmt.Errorf("query offset of %s: %w", mq, clientcore.NewBrokerError(resp))
	}
	var out protocol.OffsetResponseHeader
	if err := resp.DecodeHeader(&out); err != nil {
		return 0, fmt.Errorf("query offset of %s: %w", mq, err)
	}
	return out.Offset, nil
}

// persist commits each offset with a request that waits for its answer: oneway commits could
// be reordered by the broker, which serves every request on its own goroutine, and an older
// offset landing last would undo a hand-over.
func (s *remoteStore) persist(ctx context.Context, offsets map[MessageQueue]int64) map[MessageQueue]error {
	var failed map[MessageQueue]error
	for mq, off := range offsets {
		if err := s.commit(ctx, mq, off); err != nil {
			if failed == nil {
				failed = map[MessageQueue]error{}
			}
			failed[mq] = err
		}
	}
	return failed
}

func (s *remoteStore) commit(ctx context.Context, mq MessageQueue, off int64) error {
	addr, err := s.cl.FindBrokerAddr(ctx, mq.BrokerName, mq.Topic)
	if err != nil {
		return err
	}
	h := protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: s.group, Topic: mq.Topic, QueueID: int32(mq.QueueID), CommitOffset: off, BrokerName: mq.BrokerName}
	if _, err := s.cl.InvokeOK(ctx, addr, protocol.NewRequestWith(protocol.UpdateConsumerOffset, &h, nil)); err != nil {
		return fmt.Errorf("commit offset %d of %s: %w", off, mq, err)
	}
	return nil
}

// localStore keeps offsets in <dir>/<group>/offsets.json, rewritten atomically on every
// persist.
type localStore struct {
	path string

	mu    sync.Mutex
	table map[string]int64 // by queueKey
}

type localFile struct {
	OffsetTable map[string]int64 `json:"offsetTable"`
}

func queueKey(mq MessageQueue) string {
	return mq.Topic + "@" + mq.BrokerName + "@" + strconv.Itoa(mq.QueueID)
}

func openLocalStore(dir, group string) (*localStore, error) {
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, fmt.Errorf("local offset store: no directory given and no home directory: %w", err)
		}
		dir = filepath.Join(home, ".flowd_offsets")
	}
	if strings.ContainsAny(group, `/\`) || group == ".." {
		return nil, fmt.Errorf("local offset store: group %q cannot name a directory", group)
	}
	s := &localStore{path: filepath.Join(dir, group, "offsets.json"), table: map[string]int64{}}
	b, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("local offset store: %w", err)
	}
	var f localFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("local offset store %s: %w", s.path, err)
	}
	for k, v := range f.OffsetTable {
		s.table[k] = v
	}
	return s, nil
}

func (s *localStore) read(_ context.Context, mq MessageQueue) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if off, ok := s.table[queueKey(mq)]; ok {
		return off, nil
	}
	return -1, nil
}

func (s *localStore) persist(_ context.Context, offsets map[MessageQueue]int64) map[MessageQueue]error {
	if len(offsets) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for mq, off := range offsets {
		s.table[queueKey(mq)] = off
	}
	err := s.writeLocked()
	if err == nil {
		return nil
	}
	failed := map[MessageQueue]error{}
	for mq := range offsets {
		failed[mq] = err
	}
	return failed
}

func (s *localStore) writeLocked() error {
	b, err := json.MarshalIndent(localFile{OffsetTable: s.table}, "", "  ")
	if err != nil {
		return fmt.Errorf("local offset store: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o755); err != nil {
		return fmt.Errorf("local offset store: %w", err)
	}
	if err := atomicfile.WriteFile(s.path, b, 0o644); err != nil {
		return fmt.Errorf("local offset store: %w", err)
	}
	return nil
}
